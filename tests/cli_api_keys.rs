//! `generate --server` takes the API key from $FORGE_API_KEY or a file as well as from the
//! flag (issue 16, finding 5: a key in argv is visible in `ps`), against the real service with a
//! tenants file; the key decides the tenant.

mod common;

use std::process::Command;

use common::{service_with, sql_value};

fn generate(url: &str, extra: &[&str], env: Option<&str>) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_forge-cache"));
    cmd.args(["generate", "--server", url, "--prompt", "What is 2 + 2?", "--max-tokens", "2", "--cache-mode", "bypass", "--json"]).args(extra);
    cmd.env_remove("FORGE_API_KEY");
    if let Some(k) = env {
        cmd.env("FORGE_API_KEY", k);
    }
    let out = cmd.output().expect("run forge-cache generate");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_reads_the_api_key_from_the_environment_or_a_file() {
    let (scratch, server, _) = service_with(|config, s| {
        let path = s.dir.path().join("tenants.toml");
        std::fs::write(&path, "[[tenants]]\nname = \"acme\"\napi_keys = [\"acme-secret-1\"]\n").expect("write tenants");
        config.tenants = Some(path);
    })
    .await;
    let url = server.url();
    let key_file = scratch.dir.path().join("key.txt");
    std::fs::write(&key_file, "acme-secret-1\n").expect("write key");
    let key_file = key_file.to_string_lossy().into_owned();
    let runs = tokio::task::spawn_blocking(move || {
        [
            generate(&url, &[], None),
            generate(&url, &[], Some("acme-secret-1")),
            generate(&url, &["--api-key-file", &key_file], None),
            generate(&url, &["--api-key-file", &key_file], Some("wrong-key-123")),
        ]
    })
    .await
    .expect("join");
    assert!(!runs[0].0 && runs[0].1.contains("API key"), "no key: {}", runs[0].1);
    for (i, (ok, out)) in runs[1..].iter().enumerate() {
        assert!(ok, "run {}: {out}", i + 1);
        let v: serde_json::Value = serde_json::from_str(out.lines().find(|l| l.starts_with('{')).expect("json line")).expect("json");
        let id = v["inference_id"].as_i64().expect("inference id");
        assert_eq!(sql_value(&scratch.db, &format!("SELECT tenant FROM inferences WHERE id = {id}")), "acme");
    }
    server.stop().await.expect("stop");
}
