-- 0005: model files already hashed. A service start identifies its model by the file's size,
-- modification time and first 4 MiB (the GGUF header: metadata and tensor table); the full
-- SHA-256 (the model id in every other table) is computed the first time and looked up here
-- afterwards, so a restart does not read the whole model.

CREATE TABLE model_files (
    -- sha256 (hex) over size, modification time (ns) and the first 4 MiB of the file.
    fingerprint  TEXT    PRIMARY KEY,
    -- Where it was seen (informational: a moved file keeps its fingerprint).
    path         TEXT    NOT NULL,
    size_bytes   INTEGER NOT NULL,
    modified_ns  INTEGER NOT NULL,
    -- sha256 (hex) of the whole file: `inferences.model_id` and friends.
    sha256       TEXT    NOT NULL,
    -- Milliseconds the full hash took.
    hash_ms      REAL    NOT NULL,
    hashed_at    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
