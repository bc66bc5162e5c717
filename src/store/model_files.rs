//! The model's identity without reading the whole model at every start: a fingerprint of the
//! file (size, modification time, first 4 MiB: the GGUF header) names it; its full SHA-256 —
//! the model id every cache key and row carries — is computed once per fingerprint and
//! remembered in `model_files`. A file changed in place gets a new modification time, hence a
//! new fingerprint and a fresh hash.

use std::io::Read;
use std::path::Path;
use std::time::{Instant, UNIX_EPOCH};

use rusqlite::OptionalExtension;
use sha2::{Digest, Sha256};

use super::{hex, sha256_file, SqliteStore, StoreError};

/// Bytes of the file's beginning in its fingerprint (a GGUF header with a 50k-token vocabulary
/// is ~2 MiB).
pub const HEAD_BYTES: u64 = 4 << 20;

/// What identifies a model file cheaply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    /// sha256 (hex) over size, modification time and the first [`HEAD_BYTES`].
    pub key: String,
    /// File size, bytes.
    pub size: u64,
    /// Modification time, ns since the Unix epoch (0 when unknown).
    pub modified_ns: i64,
}

/// Reads the file's size, modification time and first [`HEAD_BYTES`].
pub fn fingerprint(path: &Path) -> std::io::Result<Fingerprint> {
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    let modified_ns = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    let mut head = Vec::new();
    file.take(HEAD_BYTES).read_to_end(&mut head)?;
    let mut h = Sha256::new();
    h.update(meta.len().to_le_bytes());
    h.update(modified_ns.to_le_bytes());
    h.update(&head);
    Ok(Fingerprint { key: hex(&h.finalize()), size: meta.len(), modified_ns })
}

/// A model file's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelIdentity {
    /// sha256 (hex) of the whole file.
    pub sha256: String,
    /// `true`: hashed now (first start on this file); `false`: remembered.
    pub hashed_now: bool,
}

impl SqliteStore {
    /// The SHA-256 of the model file at `path`: remembered for its fingerprint, else computed
    /// (reading the whole file) and remembered.
    pub fn model_identity(&self, path: &Path) -> Result<ModelIdentity, StoreError> {
        let io = |e: std::io::Error| StoreError::Invalid(format!("reading the model file {}: {e}", path.display()));
        let fp = fingerprint(path).map_err(io)?;
        let known: Option<String> =
            self.conn().query_row("SELECT sha256 FROM model_files WHERE fingerprint = ?1", [&fp.key], |r| r.get(0)).optional()?;
        if let Some(sha256) = known {
            return Ok(ModelIdentity { sha256, hashed_now: false });
        }
        let t0 = Instant::now();
        let sha256 = sha256_file(path).map_err(io)?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        self.conn().execute(
            "INSERT OR REPLACE INTO model_files (fingerprint, path, size_bytes, modified_ns, sha256, hash_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            rusqlite::params![fp.key, path.to_string_lossy(), fp.size as i64, fp.modified_ns, sha256, ms],
        )?;
        Ok(ModelIdentity { sha256, hashed_now: true })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_once_then_remembered_and_rehashed_when_the_file_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let model = dir.path().join("m.gguf");
        let body: Vec<u8> = (0..(5u32 << 20)).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
        std::fs::write(&model, &body).expect("write");
        let store = SqliteStore::open(dir.path().join("s.db")).expect("store");
        let first = store.model_identity(&model).expect("identity");
        assert!(first.hashed_now);
        assert_eq!(first.sha256, sha256_file(&model).expect("hash"));
        let again = store.model_identity(&model).expect("identity");
        assert_eq!(again, ModelIdentity { sha256: first.sha256.clone(), hashed_now: false });

        // A byte changed past the first 4 MiB, with a new modification time: hashed again.
        let mut changed = body;
        changed[(4 << 20) + 10] ^= 1;
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&model, &changed).expect("rewrite");
        let after = store.model_identity(&model).expect("identity");
        assert!(after.hashed_now);
        assert_ne!(after.sha256, first.sha256);
        assert_eq!(after.sha256, sha256_file(&model).expect("hash"));
    }
}
