-- 0005 (PostgreSQL): as migrations/0005_model_files.sql: model files already hashed, by
-- fingerprint (size, modification time, first 4 MiB). The table is shared by the replicas: one
-- whose model file has a fingerprint already hashed (same size, mtime and header) skips the full
-- read; a copy with another mtime is hashed once and added (upsert, see PgStore::model_identity).

CREATE TABLE model_files (
    fingerprint  TEXT    PRIMARY KEY,
    path         TEXT    NOT NULL,
    size_bytes   BIGINT  NOT NULL,
    modified_ns  BIGINT  NOT NULL,
    sha256       TEXT    NOT NULL,
    hash_ms      DOUBLE PRECISION NOT NULL,
    hashed_at    TEXT    NOT NULL DEFAULT forge_now()
);
