//! A configuration file edited between starts: what it changed is applied to
//! the volumes it declares (a policy change in the file used to be ignored
//! silently once the volume existed), what the admin API changed is kept while
//! the file stays the same, and a shrink is refused with a message.

mod common;

use weir_server::RunningServer;

fn config(size: &str, policy: &str) -> String {
    format!(
        "[[pools]]\nname = \"default\"\n[[policies]]\nname = \"gold\"\nlimit_iops = 5000\n{}",
        common::volume_toml("db", size, policy, "default")
    )
}

async fn start(dir: &common::TempDir, toml: &str) -> anyhow::Result<RunningServer> {
    RunningServer::start(common::config_from(toml, dir.path())).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_edits_apply_api_changes_stay_shrinks_are_refused() {
    let dir = common::TempDir::new("config-changes");
    let server = start(&dir, &config("1MiB", "non-critical")).await.unwrap();
    server.shutdown().await.unwrap();

    // The file grows the volume and changes its policy: both applied.
    let server = start(&dir, &config("2MiB", "gold")).await.unwrap();
    let admin = server.admin_client();
    let v = admin.show_volume("db").await.unwrap();
    assert_eq!((v.size_bytes, v.policy.as_str()), (2 << 20, "gold"));
    let (_, export) = common::connect(&server, "db").await;
    assert_eq!(export.size_bytes, 2 << 20, "the file grew too");
    // A change through the API …
    admin
        .set_volume_policy("db", "mission-critical")
        .await
        .unwrap();
    server.shutdown().await.unwrap();

    // … survives a restart with the same file.
    let server = start(&dir, &config("2MiB", "gold")).await.unwrap();
    let v = server.admin_client().show_volume("db").await.unwrap();
    assert_eq!(v.policy, "mission-critical");
    server.shutdown().await.unwrap();

    // A file that shrinks the volume is refused, saying why and what to write.
    let e = start(&dir, &config("1MiB", "gold")).await.err().unwrap();
    let message = format!("{e:#}");
    assert!(
        message.contains("never shrink") && message.contains("at least 2097152 bytes"),
        "{message}"
    );
}
