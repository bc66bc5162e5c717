//! Which tenant a call belongs to. Without a tenants file the `x-forge-tenant` header names it
//! (`default` when absent). With one (`serve --tenants FILE`), every call must carry a known API
//! key (`x-forge-api-key: KEY` or `authorization: Bearer KEY`) and the key decides the tenant.
//! Either way a tenant named in the request body (or, with keys, in the header) must agree.
//!
//! The file (TOML):
//!
//! ```toml
//! [[tenants]]
//! name = "acme"
//! api_keys = ["acme-secret-1", "acme-secret-2"]
//!
//! [[tenants]]
//! name = "globex"
//! api_keys = ["globex-secret"]
//! ```

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tonic::metadata::MetadataMap;

use super::error::{quoted, ServiceError};

pub const TENANT_HEADER: &str = "x-forge-tenant";
pub const API_KEY_HEADER: &str = "x-forge-api-key";
pub const DEFAULT_TENANT: &str = "default";

#[derive(Debug, thiserror::Error)]
pub enum TenantsError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{}: {msg}", path.display())]
    Invalid { path: PathBuf, msg: String },
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tenants: Vec<Entry>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    api_keys: Vec<String>,
}

#[derive(Debug, Clone)]
pub enum TenantAuth {
    /// The header (or body) names the tenant.
    Open,
    /// API key → tenant.
    Keys(KeyTable),
}

/// API keys → tenants, held as SHA-256 digests only, looked up in constant time: the presented
/// key is hashed and compared with *every* stored digest by an equality that reads all 32 bytes
/// whatever they hold (an OR of XORs behind `black_box`), and the match is selected without a
/// branch. So the time of a lookup does not depend on how much of a stored key a guess matches
/// (a `HashMap` of keys ends with a `memcmp` that stops at the first differing byte), and
/// even a leak could only reveal bits of a digest, from which no key follows. Hand-written (no
/// `subtle` crate): the comparison is of fixed-size digests, and the hashing already makes a
/// timing leak useless. `Debug` prints no key.
#[derive(Clone, Default)]
pub struct KeyTable {
    /// (sha256 of the key, tenant)
    entries: Vec<([u8; 32], String)>,
}

impl std::fmt::Debug for KeyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyTable({} keys)", self.entries.len())
    }
}

/// `a == b`, reading every byte of both whatever they hold.
fn digests_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

impl KeyTable {
    /// Adds `key` for `tenant`; the tenant it already belonged to, if any.
    pub fn insert(&mut self, key: &str, tenant: &str) -> Option<String> {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        if let Some(i) = self.find(&digest) {
            return Some(self.entries[i].1.clone());
        }
        self.entries.push((digest, tenant.to_string()));
        None
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The tenant of `key`.
    pub fn tenant(&self, key: &str) -> Option<&str> {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        self.find(&digest).map(|i| self.entries[i].1.as_str())
    }

    /// Index of `digest`, after comparing it with every entry.
    fn find(&self, digest: &[u8; 32]) -> Option<usize> {
        // Entry indexes + 1; 0 = none. Every entry is compared; the hit is kept by masking.
        let mut hit = 0usize;
        for (i, (d, _)) in self.entries.iter().enumerate() {
            let mask = usize::from(digests_equal(d, digest)).wrapping_neg();
            hit = (hit & !mask) | ((i + 1) & mask);
        }
        hit.checked_sub(1)
    }
}

/// 1–64 characters of `A-Z a-z 0-9 . _ -`.
pub fn valid_tenant_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

impl TenantAuth {
    pub fn load(path: &Path) -> Result<TenantAuth, TenantsError> {
        let text = std::fs::read_to_string(path).map_err(|source| TenantsError::Read { path: path.into(), source })?;
        let file: File = toml::from_str(&text).map_err(|source| TenantsError::Parse { path: path.into(), source })?;
        let invalid = |msg: String| TenantsError::Invalid { path: path.into(), msg };
        let mut keys = KeyTable::default();
        for t in file.tenants {
            if !valid_tenant_name(&t.name) {
                return Err(invalid(format!("tenant name {:?} must be 1-64 characters of A-Z a-z 0-9 . _ -", t.name)));
            }
            if t.api_keys.is_empty() {
                return Err(invalid(format!("tenant {:?} has no api_keys", t.name)));
            }
            for k in t.api_keys {
                if k.len() < 8 {
                    return Err(invalid(format!("an API key of tenant {:?} is shorter than 8 characters", t.name)));
                }
                if let Some(other) = keys.insert(&k, &t.name) {
                    return Err(invalid(format!("an API key is listed for both {other:?} and {:?}", t.name)));
                }
            }
        }
        if keys.is_empty() {
            return Err(invalid("no tenants".into()));
        }
        Ok(TenantAuth::Keys(keys))
    }

    /// The tenant of a call with these headers and this body `tenant` field ("" = unset).
    pub fn resolve(&self, md: &MetadataMap, body: &str) -> Result<String, ServiceError> {
        let header = |name: &str| -> Result<Option<String>, ServiceError> {
            match md.get(name) {
                None => Ok(None),
                Some(v) => v
                    .to_str()
                    .map(|s| Some(s.trim().to_string()))
                    .map_err(|_| ServiceError::InvalidArgument(format!("the {name} header is not ASCII text"))),
            }
        };
        let named: Vec<String> = [header(TENANT_HEADER)?, Some(body.trim().to_string())].into_iter().flatten().filter(|s| !s.is_empty()).collect();
        let tenant = match self {
            TenantAuth::Open => {
                let tenant = named.first().cloned().unwrap_or_else(|| DEFAULT_TENANT.to_string());
                if let Some(other) = named.iter().find(|n| **n != tenant) {
                    return Err(ServiceError::InvalidArgument(format!("the {TENANT_HEADER} header says {} but the request says {}", quoted(&tenant), quoted(other))));
                }
                tenant
            }
            TenantAuth::Keys(keys) => {
                let bearer = header("authorization")?.and_then(|a| a.strip_prefix("Bearer ").map(|k| k.trim().to_string()));
                let key = header(API_KEY_HEADER)?.or(bearer).ok_or_else(|| {
                    ServiceError::Unauthenticated(format!("this server needs an API key: send {API_KEY_HEADER}: KEY or authorization: Bearer KEY"))
                })?;
                let tenant = keys.tenant(&key).map(str::to_string).ok_or_else(|| ServiceError::Unauthenticated("unknown API key".into()))?;
                if let Some(other) = named.iter().find(|n| **n != tenant) {
                    return Err(ServiceError::PermissionDenied(format!("this API key belongs to tenant {tenant:?}, not {}", quoted(other))));
                }
                tenant
            }
        };
        if !valid_tenant_name(&tenant) {
            return Err(ServiceError::InvalidArgument(format!("tenant name {} must be 1-64 characters of A-Z a-z 0-9 . _ -", quoted(&tenant))));
        }
        Ok(tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn md(pairs: &[(&'static str, &str)]) -> MetadataMap {
        let mut m = MetadataMap::new();
        for (k, v) in pairs {
            m.insert(*k, v.parse().expect("ascii"));
        }
        m
    }

    fn code(r: Result<String, ServiceError>) -> Code {
        r.map_err(tonic::Status::from).expect_err("must fail").code()
    }

    #[test]
    fn open_mode_uses_header_or_body() {
        let a = TenantAuth::Open;
        assert_eq!(a.resolve(&md(&[]), "").expect("ok"), "default");
        assert_eq!(a.resolve(&md(&[(TENANT_HEADER, "acme")]), "").expect("ok"), "acme");
        assert_eq!(a.resolve(&md(&[]), "acme").expect("ok"), "acme");
        assert_eq!(a.resolve(&md(&[(TENANT_HEADER, "acme")]), "acme").expect("ok"), "acme");
        assert_eq!(code(a.resolve(&md(&[(TENANT_HEADER, "acme")]), "globex")), Code::InvalidArgument);
        assert_eq!(code(a.resolve(&md(&[(TENANT_HEADER, "bad name")]), "")), Code::InvalidArgument);
    }

    #[test]
    fn keys_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tenants.toml");
        std::fs::write(&path, "[[tenants]]\nname = \"acme\"\napi_keys = [\"acme-key-1\"]\n[[tenants]]\nname = \"globex\"\napi_keys = [\"globex-key-1\"]\n")
            .expect("write");
        let a = TenantAuth::load(&path).expect("load");
        assert_eq!(a.resolve(&md(&[(API_KEY_HEADER, "acme-key-1")]), "").expect("ok"), "acme");
        assert_eq!(a.resolve(&md(&[("authorization", "Bearer globex-key-1")]), "globex").expect("ok"), "globex");
        assert_eq!(code(a.resolve(&md(&[]), "")), Code::Unauthenticated);
        assert_eq!(code(a.resolve(&md(&[(API_KEY_HEADER, "nope-nope-nope")]), "")), Code::Unauthenticated);
        assert_eq!(code(a.resolve(&md(&[(API_KEY_HEADER, "acme-key-1"), (TENANT_HEADER, "globex")]), "")), Code::PermissionDenied);
        assert_eq!(code(a.resolve(&md(&[(API_KEY_HEADER, "acme-key-1")]), "globex")), Code::PermissionDenied);
    }

    #[test]
    fn the_key_table_finds_exact_keys_only_and_prints_none() {
        let mut t = KeyTable::default();
        assert_eq!(t.insert("acme-secret-1", "acme"), None);
        assert_eq!(t.insert("acme-secret-2", "acme"), None);
        assert_eq!(t.insert("globex-secret", "globex"), None);
        assert_eq!(t.insert("globex-secret", "acme"), Some("globex".to_string()), "a key belongs to one tenant");
        assert_eq!(t.tenant("acme-secret-2"), Some("acme"));
        assert_eq!(t.tenant("globex-secret"), Some("globex"));
        for near in ["acme-secret-", "acme-secret-3", "acme-secret-1 ", "globex-secreT", ""] {
            assert_eq!(t.tenant(near), None, "{near:?}");
        }
        let shown = format!("{:?}", TenantAuth::Keys(t));
        assert!(!shown.contains("secret"), "{shown}");
        assert!(digests_equal(&[7; 32], &[7; 32]) && !digests_equal(&[7; 32], &{ let mut d = [7; 32]; d[31] = 8; d }));
    }

    #[test]
    fn bad_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.toml");
        for bad in ["tenants = []", "[[tenants]]\nname = \"a b\"\napi_keys = [\"12345678\"]", "[[tenants]]\nname = \"a\"\napi_keys = [\"short\"]",
            "[[tenants]]\nname = \"a\"\napi_keys = [\"12345678\"]\n[[tenants]]\nname = \"b\"\napi_keys = [\"12345678\"]", "nonsense ="] {
            std::fs::write(&path, bad).expect("write");
            assert!(TenantAuth::load(&path).is_err(), "{bad}");
        }
        assert!(matches!(TenantAuth::load(&dir.path().join("missing.toml")), Err(TenantsError::Read { .. })));
    }
}
