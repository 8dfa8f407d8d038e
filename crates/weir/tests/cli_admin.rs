//! `weir volume` / `weir policy` against a running `weir serve`: the CLI finds
//! the admin token in the server's data directory with no token flag, and is
//! refused without it.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{TempDir, WeirProcess};
use weir_testkit::output_text;

/// Runs the `weir` CLI with `XDG_DATA_HOME` = `xdg` (so its default data
/// directory is `xdg/weir`) and no token in the environment unless `token`.
fn weir(xdg: &Path, token: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weir"));
    c.args(args)
        .env("XDG_DATA_HOME", xdg)
        .env_remove("WEIR_ADMIN_TOKEN");
    if let Some(t) = token {
        c.env("WEIR_ADMIN_TOKEN", t);
    }
    c.output().expect("weir runs")
}

#[test]
fn cli_reads_the_admin_token_from_the_data_directory() {
    let dir = TempDir::new("cli-admin");
    let xdg = dir.join("xdg");
    // The server on the CLI's default data directory (as `weir serve` alone would be).
    let proc = WeirProcess::start_on(dir.path(), "", &xdg.join("weir"));
    let admin = proc.admin_addr.to_string();

    let o = weir(
        &xdg,
        None,
        &[
            "volume", "create", "cli-vol", "--size", "1M", "--admin", &admin,
        ],
    );
    assert!(o.status.success(), "{}", output_text(&o));
    let o = weir(&xdg, None, &["volume", "list", "--json", "--admin", &admin]);
    assert!(o.status.success(), "{}", output_text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v.as_array().unwrap().iter().any(|v| v["name"] == "cli-vol"),
        "{v}"
    );
    let o = weir(&xdg, None, &["policy", "list", "--admin", &admin]);
    assert!(o.status.success(), "{}", output_text(&o));

    // Elsewhere (another data directory, no token): refused, with a hint.
    let elsewhere = dir.join("elsewhere");
    let o = weir(&elsewhere, None, &["volume", "list", "--admin", &admin]);
    assert_eq!(o.status.code(), Some(2), "{}", output_text(&o));
    assert!(output_text(&o).contains("token"), "{}", output_text(&o));
    // … unless given the token: $WEIR_ADMIN_TOKEN, --admin-token-file, --data-dir.
    let o = weir(
        &elsewhere,
        Some(&proc.admin_token),
        &["volume", "list", "--admin", &admin],
    );
    assert!(o.status.success(), "{}", output_text(&o));
    let file = xdg.join("weir/admin-token").display().to_string();
    let o = weir(
        &elsewhere,
        None,
        &[
            "volume",
            "list",
            "--admin",
            &admin,
            "--admin-token-file",
            &file,
        ],
    );
    assert!(o.status.success(), "{}", output_text(&o));
    let data = xdg.join("weir").display().to_string();
    let o = weir(
        &elsewhere,
        None,
        &[
            "volume",
            "delete",
            "cli-vol",
            "--yes",
            "--admin",
            &admin,
            "--data-dir",
            &data,
        ],
    );
    assert!(o.status.success(), "{}", output_text(&o));
    let o = weir(
        &elsewhere,
        Some("wrong"),
        &["volume", "list", "--admin", &admin],
    );
    assert_eq!(o.status.code(), Some(2), "{}", output_text(&o));
}

#[test]
fn cli_creates_a_flash_cached_volume_and_switches_its_cache() {
    let dir = TempDir::new("cli-cache");
    let xdg = dir.join("xdg");
    let config = format!(
        "[[pools]]\nname = \"fast\"\nflash_cache = {{ dir = \"{}\", size = \"1MiB\" }}\n[[pools]]\nname = \"slow\"\n",
        dir.join("cache").display()
    );
    let proc = WeirProcess::start_on(dir.path(), &config, &xdg.join("weir"));
    let admin = proc.admin_addr.to_string();
    let json = |args: &[&str]| -> serde_json::Value {
        let mut all = args.to_vec();
        all.extend(["--json", "--admin", &admin]);
        let o = weir(&xdg, None, &all);
        assert!(o.status.success(), "{args:?}: {}", output_text(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let v = json(&[
        "volume", "create", "db", "--size", "1M", "--pool", "fast", "--cache", "flash",
    ]);
    assert_eq!(v["cache"], "flash", "{v}");
    let v = json(&["volume", "set-cache", "db", "none"]);
    assert_eq!(v["cache"], "none", "{v}");
    assert_eq!(json(&["volume", "show", "db"])["cache"], "none");
    // A pool without a flash cache: refused with the reason.
    let o = weir(
        &xdg,
        None,
        &[
            "volume", "create", "db2", "--size", "1M", "--pool", "slow", "--cache", "flash",
            "--admin", &admin,
        ],
    );
    assert!(!o.status.success());
    assert!(
        output_text(&o).contains("needs a flash cache on pool \"slow\""),
        "{}",
        output_text(&o)
    );
    let o = weir(
        &xdg,
        None,
        &["volume", "set-cache", "db", "ssd", "--admin", &admin],
    );
    assert_eq!(o.status.code(), Some(2), "{}", output_text(&o));
}

/// `weir load … 2>&1 | head`, `weir volume list | head`: a reader that closed the
/// pipe before the command printed is no error. The commands end with their own
/// status (0 here) instead of a "Broken pipe" panic (exit 101).
#[test]
fn commands_into_a_closed_pipe_end_with_their_own_status() {
    let dir = TempDir::new("cli-pipe");
    let proc = WeirProcess::start(
        dir.path(),
        "[[volumes]]\nname = \"v\"\nsize = \"16MiB\"\npolicy = \"non-critical\"\n",
    );
    let target = format!("nbd://{}/v", proc.nbd_addr);
    let admin = proc.admin_addr.to_string();
    for args in [
        vec![
            "load",
            "-q",
            "-d",
            "1s",
            "-t",
            &target,
            "bs=4k,randread,qd=1,vms=1",
        ],
        vec!["volume", "list", "--admin", &admin],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(&args)
            .env("WEIR_ADMIN_TOKEN", &proc.admin_token)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("weir runs");
        // Both read ends closed before anything is printed.
        drop(child.stdout.take());
        drop(child.stderr.take());
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "weir {args:?}: {status:?}");
    }
}
