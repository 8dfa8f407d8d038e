//! The Debian package (deploy/deb/build.sh): its control fields, its files, a
//! binary that runs once unpacked, units and config where the units look for them.

use std::path::Path;
use std::process::Command;

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("command starts");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn the_package_installs_a_working_weir_with_units_config_and_docs() {
    if let Some(missing) = ["dpkg-deb", "dpkg", "objdump"]
        .into_iter()
        .find(|t| !have(t))
    {
        println!("skipped: {missing} is not installed (Debian: dpkg-dev, binutils)");
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = weir_testkit::TempDir::new("deb");
    let deb = run(Command::new("bash")
        .arg(repo.join("deploy/deb/build.sh"))
        .env("WEIR_BIN", env!("CARGO_BIN_EXE_weir"))
        .env("OUT_DIR", out.path()));
    let deb = deb.trim();
    assert!(deb.ends_with(".deb") && Path::new(deb).exists(), "{deb}");

    let field = |name: &str| run(Command::new("dpkg-deb").args(["-f", deb, name]));
    assert_eq!(field("Package").trim(), "weir");
    assert_eq!(field("Version").trim(), env!("CARGO_PKG_VERSION"));
    assert!(
        field("Depends").starts_with("libc6 (>= 2."),
        "{}",
        field("Depends")
    );
    let conffiles = run(Command::new("sh").arg("-c").arg(format!(
        "dpkg-deb --ctrl-tarfile {deb} | tar -xO ./conffiles"
    )));
    assert_eq!(conffiles.trim(), "/etc/weir/weir.toml");

    let root = out.path().join("root");
    run(Command::new("dpkg-deb").args(["-x", deb]).arg(&root));
    for file in [
        "usr/bin/weir",
        "lib/systemd/system/weir.service",
        "lib/systemd/system/weir-nbd.socket",
        "lib/systemd/system/weir-admin.socket",
        "etc/weir/weir.toml",
        "usr/share/man/man1/weir.1.gz",
        "usr/share/man/man1/weir-serve.1.gz",
        "usr/share/bash-completion/completions/weir",
        "usr/share/zsh/vendor-completions/_weir",
        "usr/share/weir/grafana/weir.json",
        "usr/share/doc/weir/copyright",
    ] {
        assert!(root.join(file).is_file(), "{file} missing from the package");
    }
    // The unpacked binary runs, and the unit starts it with the packaged config,
    // which that binary accepts.
    let version = run(Command::new(root.join("usr/bin/weir")).arg("--version"));
    assert!(version.starts_with("weir "), "{version}");
    let unit = std::fs::read_to_string(root.join("lib/systemd/system/weir.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/weir serve --config /etc/weir/weir.toml"));
    let text = std::fs::read_to_string(root.join("etc/weir/weir.toml")).unwrap();
    weir_server::config::WeirConfig::from_toml_str(&text, "etc/weir/weir.toml")
        .expect("the packaged config is valid");
}
