//! The official `openai` Python client against the server: `tools/openai_client_check.py`
//! run with the Python of a virtual environment that has the library (`.ci/run` makes one).
//! The interpreter is `$NANO_SERVING_OPENAI_PYTHON`, else `.venv-openai/bin/python` at the
//! workspace root; without one (or without the library), the test says why it skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

use phase6_server::ServeOptions;

use crate::harness::start;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("phase6-engine/server sits in the workspace")
        .to_path_buf()
}

/// The Python to use, or why there is none.
fn python() -> Result<PathBuf, String> {
    let python = match std::env::var_os("NANO_SERVING_OPENAI_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => {
            let venv = workspace_root().join(".venv-openai/bin/python");
            if !venv.exists() {
                return Err(format!(
                    "NANO_SERVING_OPENAI_PYTHON is not set and {} does not exist (.ci/run creates it)",
                    venv.display()
                ));
            }
            venv
        }
    };
    let probe = Command::new(&python)
        .args(["-c", "import openai"])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !probe.status.success() {
        return Err(format!(
            "{} cannot import openai: {}",
            python.display(),
            String::from_utf8_lossy(&probe.stderr)
                .lines()
                .last()
                .unwrap_or("no message")
        ));
    }
    Ok(python)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_client_understands_every_answer() {
    let python = match python() {
        Ok(p) => p,
        Err(reason) => {
            println!("skipped: {reason}");
            return;
        }
    };
    let key = "test-key";
    let s = start(ServeOptions {
        api_key: Some(key.into()),
        ..ServeOptions::default()
    })
    .await;
    let script = workspace_root().join("tools/openai_client_check.py");
    let base = s.base.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .args([base.as_str(), "tiny-shakespeare", key])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("all openai client checks passed"));
}
