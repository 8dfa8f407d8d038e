//! The CLI's frictions of issue 14, each against a real `weir serve`: which
//! server answers (`--admin` URLs and host names, `WEIR_ADMIN`), confirmation of
//! destructive commands, `policy update`, access groups, repeating stats, sizes
//! with units, capacity and overcommit, the audit log, configuration edits.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{TempDir, WeirProcess};
use weir_testkit::output_text;

/// `weir ARGS` with the server's token, no terminal on standard input, and
/// `WEIR_ADMIN` unset unless `admin_env`.
fn weir_env(p: &WeirProcess, admin_env: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weir"));
    c.args(args)
        .env("WEIR_ADMIN_TOKEN", &p.admin_token)
        .env_remove("WEIR_ADMIN")
        .stdin(Stdio::null());
    if let Some(a) = admin_env {
        c.env("WEIR_ADMIN", a);
    }
    c.output().expect("weir runs")
}

/// `weir ARGS --admin <the server>`.
fn weir(p: &WeirProcess, args: &[&str]) -> Output {
    let admin = p.admin_addr.to_string();
    let mut all = args.to_vec();
    all.extend(["--admin", &admin]);
    weir_env(p, None, &all)
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", output_text(o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn refused(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(2), "{}", output_text(o));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("weir.log")).unwrap_or_default()
}

#[test]
fn admin_urls_host_names_and_weir_admin_reach_the_server_and_say_which() {
    let dir = TempDir::new("cli-admin-url");
    let p = WeirProcess::start(dir.path(), "");
    let port = p.admin_addr.port();
    // The banner's own form, a host name, and the environment variable.
    for admin in [
        format!("http://127.0.0.1:{port}/"),
        format!("localhost:{port}"),
    ] {
        let o = weir_env(&p, None, &["volume", "list", "--admin", &admin]);
        ok(&o);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("server: http://") && err.contains("weir 0.1.0") && err.contains("host "),
            "{err}"
        );
    }
    let url = format!("http://127.0.0.1:{port}");
    let o = weir_env(&p, Some(&url), &["volume", "list"]);
    ok(&o);
    assert!(String::from_utf8_lossy(&o.stderr).contains(&url));
    // No server there: said, with the way to name another.
    let o = weir_env(&p, Some("127.0.0.1:1"), &["volume", "list"]);
    let err = refused(&o);
    assert!(err.contains("WEIR_ADMIN"), "{err}");
    let err = refused(&weir_env(
        &p,
        Some("https://127.0.0.1"),
        &["volume", "list"],
    ));
    assert!(err.contains("plain HTTP"), "{err}");
}

#[test]
fn destructive_commands_need_yes_and_sizes_need_units() {
    let dir = TempDir::new("cli-confirm");
    let p = WeirProcess::start(dir.path(), "");
    let err = refused(&weir(&p, &["volume", "create", "tiny", "--size", "5"]));
    assert!(err.contains("no unit") && err.contains("5GB"), "{err}");
    ok(&weir(&p, &["volume", "create", "v1", "--size", "5M"]));
    let shown = ok(&weir(&p, &["volume", "show", "v1", "--json"]));
    assert!(shown.contains("\"size_bytes\": 5242880"), "{shown}");

    let err = refused(&weir(&p, &["volume", "delete", "v1"]));
    assert!(err.contains("--yes") && err.contains("5 MiB"), "{err}");
    ok(&weir(&p, &["volume", "show", "v1"]));
    ok(&weir(&p, &["volume", "delete", "v1", "--yes"]));
    refused(&weir(&p, &["volume", "show", "v1"]));

    ok(&weir(
        &p,
        &["policy", "create", "tmp", "--limit-iops", "100"],
    ));
    refused(&weir(&p, &["policy", "delete", "tmp"]));
    ok(&weir(&p, &["policy", "delete", "tmp", "-y"]));
}

#[test]
fn policy_update_changes_a_policy_live_and_create_does_not_replace() {
    let dir = TempDir::new("cli-policy-update");
    let p = WeirProcess::start(dir.path(), "");
    ok(&weir(
        &p,
        &["policy", "create", "gold", "--limit-iops", "1000"],
    ));
    let err = refused(&weir(
        &p,
        &["policy", "create", "gold", "--limit-iops", "50"],
    ));
    assert!(
        err.contains("already exists") && err.contains("policy update"),
        "{err}"
    );
    ok(&weir(
        &p,
        &["volume", "create", "db", "--size", "1M", "--policy", "gold"],
    ));
    let out = ok(&weir(
        &p,
        &[
            "policy",
            "update",
            "gold",
            "--limit-iops",
            "500",
            "--reservation-iops",
            "100",
            "--json",
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["limit_iops"], 500.0);
    assert_eq!(v[0]["reservation_iops"], 100.0);
    // The volume's scheduler enforces the new figures at once.
    let stats = ok(&weir(&p, &["volume", "stats", "db", "--json"]));
    let s: serde_json::Value = serde_json::from_str(stats.trim()).unwrap();
    assert_eq!(s["applied_policy"]["limit_iops"], 500.0, "{s}");
    // `none` removes a figure; no change at all is refused.
    let out = ok(&weir(
        &p,
        &["policy", "update", "gold", "--limit-iops", "none", "--json"],
    ));
    assert!(out.contains("\"limit_iops\": null"), "{out}");
    let err = refused(&weir(&p, &["policy", "update", "gold"]));
    assert!(err.contains("no change"), "{err}");
    let err = refused(&weir(
        &p,
        &[
            "policy",
            "update",
            "mission-critical",
            "--limit-iops",
            "100",
        ],
    ));
    assert!(err.contains("built in"), "{err}");
    // The change is in the audit log.
    assert!(
        log(dir.path()).contains("admin: PUT /v1/policies/gold"),
        "{}",
        log(dir.path())
    );
}

#[test]
fn access_groups_are_managed_from_the_cli() {
    let dir = TempDir::new("cli-groups");
    let p = WeirProcess::start(dir.path(), "");
    ok(&weir(
        &p,
        &[
            "access-group",
            "create",
            "lab",
            "--hosts",
            "10.0.0.0/8,127.0.0.1",
        ],
    ));
    let err = refused(&weir(
        &p,
        &["access-group", "create", "lab", "--hosts", "*"],
    ));
    assert!(err.contains("already exists"), "{err}");
    let err = refused(&weir(
        &p,
        &["access-group", "create", "bad", "--hosts", "nope"],
    ));
    assert!(!err.is_empty());
    ok(&weir(
        &p,
        &["access-group", "update", "lab", "--hosts", "192.168.0.0/16"],
    ));
    let list = ok(&weir(&p, &["access-group", "list"]));
    assert!(
        list.contains("lab") && list.contains("192.168.0.0/16"),
        "{list}"
    );
    assert!(!list.contains("10.0.0.0/8"), "{list}");
    refused(&weir(&p, &["access-group", "delete", "lab"]));
    ok(&weir(&p, &["access-group", "delete", "lab", "--yes"]));
    refused(&weir(&p, &["access-group", "show", "lab"]));
}

/// `volume create --hosts`: the group `NAME-hosts` it makes is removed again when
/// the volume cannot be created, and one that exists with other members is never
/// rewritten (other volumes may be in it).
#[test]
fn volume_create_with_hosts_leaves_no_group_behind_and_rewrites_none() {
    let dir = TempDir::new("cli-create-hosts");
    let p = WeirProcess::start(dir.path(), "");
    let create = |name: &str, pool: &str, hosts: &str| {
        let args = [
            "volume",
            "create",
            name,
            "--size",
            "1M",
            "--policy",
            "non-critical",
        ];
        let mut args = args.to_vec();
        args.extend(["--pool", pool, "--hosts", hosts]);
        weir(&p, &args)
    };
    // Refused by the server (no such pool): no group left.
    let err = refused(&create("v1", "nope", "127.0.0.1"));
    assert!(err.contains("nope"), "{err}");
    refused(&weir(&p, &["access-group", "show", "v1-hosts"]));
    // Created: the group exists; the same hosts again reuse it.
    ok(&create("v2", "default", "127.0.0.1"));
    ok(&weir(&p, &["access-group", "show", "v2-hosts"]));
    // Deleted with its volume (no other volume is in it): the name can be
    // created again with other hosts.
    let out = ok(&weir(&p, &["volume", "delete", "v2", "--yes"]));
    assert!(out.contains("v2-hosts"), "{out}");
    refused(&weir(&p, &["access-group", "show", "v2-hosts"]));
    ok(&create("v2", "default", "10.0.0.0/8"));
    ok(&weir(&p, &["volume", "delete", "v2", "--yes"]));
    // A group of that name with other members (made by hand; other volumes may
    // use it): refused, the group unchanged.
    ok(&weir(
        &p,
        &["access-group", "create", "v2-hosts", "--hosts", "127.0.0.1"],
    ));
    let err = refused(&create("v2", "default", "10.0.0.0/8"));
    assert!(err.contains("exists with other members"), "{err}");
    let group = ok(&weir(&p, &["access-group", "show", "v2-hosts"]));
    assert!(
        group.contains("127.0.0.1") && !group.contains("10.0.0.0/8"),
        "{group}"
    );
}

#[test]
fn stats_interval_repeats_and_count_stops_it() {
    let dir = TempDir::new("cli-stats");
    let p = WeirProcess::start(dir.path(), "");
    ok(&weir(&p, &["volume", "create", "s", "--size", "1M"]));
    let out = ok(&weir(
        &p,
        &["volume", "stats", "s", "--interval", "0.1", "--count", "3"],
    ));
    assert_eq!(out.matches("last 0.").count(), 3, "{out}");
    let out = ok(&weir(
        &p,
        &[
            "volume",
            "stats",
            "s",
            "--interval",
            "0.1",
            "--count",
            "2",
            "--json",
        ],
    ));
    assert_eq!(out.lines().count(), 2, "one JSON document per line: {out}");
}

#[test]
fn pool_list_shows_capacity_and_overcommit_is_warned() {
    let dir = TempDir::new("cli-pools");
    let p = WeirProcess::start(dir.path(), "");
    let out = ok(&weir(&p, &["pool", "list", "--json"]));
    let pools: serde_json::Value = serde_json::from_str(&out).unwrap();
    let free = pools[0]["free_bytes"].as_u64().unwrap();
    assert!(pools[0]["capacity_bytes"].as_u64().unwrap() >= free);
    // A sparse volume larger than the free space: created, with a warning.
    let size = format!("{}G", free / (1 << 30) + 2);
    let o = weir(&p, &["volume", "create", "big", "--size", &size]);
    ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("warning: pool \"default\" is overcommitted"),
        "{err}"
    );
    let table = ok(&weir(&p, &["pool", "list"]));
    assert!(
        table.contains("OVERCOMMITTED") && table.contains("provisioned"),
        "{table}"
    );
    assert!(
        log(dir.path()).contains("is overcommitted"),
        "{}",
        log(dir.path())
    );
    assert!(log(dir.path()).contains("admin: POST /v1/volumes"));
}

#[test]
fn configuration_edits_are_applied_and_logged() {
    let dir = TempDir::new("cli-config-diff");
    let volume = |policy: &str| {
        format!("[[volumes]]\nname = \"db\"\nsize = \"1MiB\"\npolicy = \"{policy}\"\n")
    };
    let p = WeirProcess::start(dir.path(), &volume("non-critical"));
    p.terminate();
    drop(p);
    let p = WeirProcess::start(dir.path(), &volume("mission-critical"));
    let shown = ok(&weir(&p, &["volume", "show", "db", "--json"]));
    assert!(
        shown.contains("\"policy\": \"mission-critical\""),
        "{shown}"
    );
    let log = log(dir.path());
    assert!(
        log.contains(
            "config: volume \"db\": applied policy \"non-critical\" -> \"mission-critical\""
        ),
        "{log}"
    );
}

/// `weir top` without a terminal (a pipe, cron, CI) says to use `--batch`
/// instead of panicking in the terminal library.
#[test]
fn top_without_a_terminal_points_to_batch() {
    let o = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["top", "--admin", "127.0.0.1:1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = refused(&o);
    assert!(
        err.contains("not a terminal") && err.contains("--batch") && !err.contains("panicked"),
        "{err}"
    );
}

/// Refresh periods out of range are refused by the argument parser, before
/// anything runs (a huge one panicked converting to a duration; a tiny one spins).
#[test]
fn refresh_periods_out_of_range_are_refused() {
    for args in [
        &["top", "-b", "-d", "1e20"][..],
        &["top", "-b", "--delay", "0.001"],
        &["top", "-b", "-d", "nan"],
        &["volume", "stats", "v", "--interval", "1e20"],
        &["volume", "stats", "v", "--interval=-1"],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(args)
            .args(["--admin", "127.0.0.1:1"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("0.1-86400 seconds") || err.contains("is not a number of seconds"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// A token file of two lines is the caller's mistake, said before anything is
/// sent (it was reported as a malformed answer from the server).
#[test]
fn a_token_of_two_lines_is_refused_here() {
    let dir = TempDir::new("cli-token-lines");
    let file = dir.join("token");
    std::fs::write(&file, "abc\ndef\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "volume",
            "list",
            "--admin",
            "127.0.0.1:1",
            "--admin-token-file",
        ])
        .arg(&file)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = refused(&o);
    assert!(
        err.contains("one word of visible ASCII") && !err.contains("malformed"),
        "{err}"
    );
}

/// The NBD and admin listeners on one port: said as such before anything starts
/// (it was "Address already in use").
#[test]
fn one_port_for_nbd_and_the_admin_api_is_refused() {
    let dir = TempDir::new("cli-same-port");
    let o = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:23457",
            "--admin-listen",
            "0.0.0.0:23457",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = refused(&o);
    assert!(err.contains("same port"), "{err}");
}

#[test]
fn completions_and_man_pages_are_generated() {
    let dir = TempDir::new("cli-completions");
    let bin = env!("CARGO_BIN_EXE_weir");
    let o = Command::new(bin)
        .args(["completions", "bash"])
        .output()
        .unwrap();
    let script = ok(&o);
    assert!(script.contains("access-group") && script.contains("--yes"));
    let path = dir.join("weir.bash");
    std::fs::write(&path, &script).unwrap();
    let check = Command::new("bash").arg("-n").arg(&path).output().unwrap();
    assert!(check.status.success(), "{}", output_text(&check));
    for shell in ["zsh", "fish"] {
        let o = Command::new(bin)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(!ok(&o).is_empty());
    }
    let man = dir.join("man");
    let o = Command::new(bin)
        .args(["man", "--dir"])
        .arg(&man)
        .output()
        .unwrap();
    ok(&o);
    let page = std::fs::read_to_string(man.join("weir-volume-delete.1")).unwrap();
    assert!(page.starts_with(".ie") || page.contains(".TH"), "{page}");
    assert!(page.contains("yes"), "{page}");
    assert!(man.join("weir.1").exists() && man.join("weir-policy-update.1").exists());
    let o = Command::new(bin).arg("--version").output().unwrap();
    assert!(ok(&o).contains("(commit "));
}
