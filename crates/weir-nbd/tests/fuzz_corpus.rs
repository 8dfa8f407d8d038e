//! Replays the fuzz corpus kept in `fuzz/corpus/` (inputs libFuzzer found that
//! reach new code, minimised) and `fuzz/regressions/` (inputs that once broke an
//! invariant) through the same harnesses libFuzzer runs, on every test run.

use std::path::{Path, PathBuf};

fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz")
        .join(kind)
        .join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return vec![];
    };
    let mut files: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

fn replay(target: &str, harness: fn(&[u8])) {
    let corpus = inputs("corpus", target);
    assert!(
        corpus.len() >= 50,
        "fuzz/corpus/{target} holds {} inputs",
        corpus.len()
    );
    for path in corpus.iter().chain(&inputs("regressions", target)) {
        let data = std::fs::read(path).unwrap();
        let outcome = std::panic::catch_unwind(|| harness(&data));
        assert!(
            outcome.is_ok(),
            "{} breaks the {target} harness",
            path.display()
        );
    }
}

#[test]
fn server_corpus_replays() {
    replay("server", weir_nbd::fuzz::server);
}

#[test]
fn client_corpus_replays() {
    replay("client", weir_nbd::fuzz::client);
}
