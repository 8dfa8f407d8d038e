//! Records the commit the binary is built from (`weir --version`,
//! `weir_build_info`): `$WEIR_COMMIT` if set (packages built outside git), else
//! `git rev-parse --short=12 HEAD`, else "unknown".

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=WEIR_COMMIT");
    let commit = std::env::var("WEIR_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=WEIR_COMMIT={commit}");
    // Built again when HEAD moves (a commit, a checkout); only files that exist,
    // or cargo would rebuild every time.
    let mut watched = Vec::new();
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        watched.push(format!("{dir}/HEAD"));
    }
    if let (Some(common), Some(head_ref)) = (
        git(&["rev-parse", "--git-common-dir"]),
        git(&["symbolic-ref", "-q", "HEAD"]),
    ) {
        let common = std::path::Path::new(&common);
        let common = if common.is_absolute() {
            common.to_path_buf()
        } else {
            std::env::current_dir().unwrap_or_default().join(common)
        };
        watched.push(common.join(head_ref).display().to_string());
        watched.push(common.join("packed-refs").display().to_string());
    }
    for path in watched {
        if std::path::Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
