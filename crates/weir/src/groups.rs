//! `weir access-group …`: who may reach the volumes that name a group.

use anyhow::{Result, bail};
use clap::Subcommand;
use weir_report::{Column, Table};
use weir_server::admin::{Client, ClientError};
use weir_server::config::AccessGroupConfig;

use crate::admin::{AdminTarget, admin_client, announce, explain, print_json, runtime};
use crate::target::confirm;

#[derive(Subcommand)]
pub enum AccessGroupCommand {
    /// List access groups and the volumes that use them
    List,
    /// Show one access group
    Show {
        /// The group's name
        name: String,
    },
    /// Create an access group (refused if one has the name: `update` changes it)
    Create {
        /// The group's name
        name: String,
        /// Hosts it admits: addresses or CIDRs, comma-separated; "*" for any host
        #[arg(long, value_delimiter = ',', required = true)]
        hosts: Vec<String>,
        /// TLS client identities (certificate subject CNs) it also requires, comma-separated
        #[arg(long, value_delimiter = ',')]
        identities: Vec<String>,
    },
    /// Replace a group's hosts or identities (new connections follow)
    Update {
        /// The group's name
        name: String,
        /// The new host list (addresses or CIDRs, comma-separated); absent: unchanged
        #[arg(long, value_delimiter = ',')]
        hosts: Option<Vec<String>>,
        /// The new identity list, comma-separated ("" for none); absent: unchanged
        #[arg(long, value_delimiter = ',')]
        identities: Option<Vec<String>>,
    },
    /// Delete an access group (refused while volumes use it; asks first)
    Delete {
        /// The group's name
        name: String,
    },
}

pub fn run(target: AdminTarget, command: AccessGroupCommand) -> Result<()> {
    let (client, endpoint) = admin_client(&target)?;
    runtime()?.block_on(async {
        announce(&client, &endpoint, target.json()).await?;
        let shown = match command {
            AccessGroupCommand::List => client.list_access_groups().await.map_err(explain)?,
            AccessGroupCommand::Show { name } => {
                vec![client.show_access_group(&name).await.map_err(explain)?]
            }
            AccessGroupCommand::Create {
                name,
                hosts,
                identities,
            } => {
                if exists(&client, &name).await? {
                    bail!("access group {name:?} already exists (`weir access-group update` changes it)");
                }
                let group = AccessGroupConfig {
                    name,
                    hosts,
                    identities,
                };
                vec![client.put_access_group(&group).await.map_err(explain)?]
            }
            AccessGroupCommand::Update {
                name,
                hosts,
                identities,
            } => {
                let mut group = client.show_access_group(&name).await.map_err(explain)?;
                if hosts.is_none() && identities.is_none() {
                    bail!("access-group update {name:?}: give --hosts or --identities");
                }
                if let Some(h) = hosts {
                    group.hosts = h;
                }
                if let Some(i) = identities {
                    group.identities = i.into_iter().filter(|s| !s.is_empty()).collect();
                }
                vec![client.put_access_group(&group).await.map_err(explain)?]
            }
            AccessGroupCommand::Delete { name } => {
                client.show_access_group(&name).await.map_err(explain)?;
                confirm(
                    target.yes(),
                    &format!("Delete access group {name:?} on {}?", endpoint.url),
                )?;
                let g = client.delete_access_group(&name).await.map_err(explain)?;
                outln!("deleted access group {}", g.name);
                return Ok(());
            }
        };
        if target.json() {
            return print_json(&shown);
        }
        let volumes = client.list_volumes().await.map_err(explain)?;
        let mut table = Table::new(vec![
            Column::left("access group"),
            Column::left("hosts"),
            Column::left("identities"),
            Column::left("volumes"),
        ]);
        for g in &shown {
            let users: Vec<&str> = volumes
                .iter()
                .filter(|v| v.access_groups.contains(&g.name))
                .map(|v| v.name.as_str())
                .collect();
            table.add_row([
                g.name.clone(),
                g.hosts.join(","),
                dash(&g.identities.join(",")),
                dash(&users.join(",")),
            ]);
        }
        out!("{table}");
        Ok(())
    })
}

fn dash(s: &str) -> String {
    if s.is_empty() { "-".into() } else { s.into() }
}

async fn exists(client: &Client, name: &str) -> Result<bool> {
    match client.show_access_group(name).await {
        Ok(_) => Ok(true),
        Err(ClientError::Api { status: 404, .. }) => Ok(false),
        Err(e) => Err(explain(e)),
    }
}
