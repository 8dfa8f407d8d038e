//! `weir pool list`: each pool's space, what its volumes promise, overcommit.

use anyhow::Result;
use clap::Subcommand;
use weir_report::{Column, Table};

use crate::admin::{AdminTarget, admin_client, announce, explain, human_size, print_json, runtime};

#[derive(Subcommand)]
pub enum PoolCommand {
    /// Pools: file system capacity and free space, bytes allocated, bytes the
    /// volumes promise (provisioned) and the overcommit ratio
    List,
}

pub fn run(target: AdminTarget, command: PoolCommand) -> Result<()> {
    let (client, endpoint) = admin_client(&target)?;
    runtime()?.block_on(async {
        announce(&client, &endpoint, target.json()).await?;
        match command {
            PoolCommand::List => {
                let pools = client.capacity().await.map_err(explain)?;
                if target.json() {
                    return print_json(&pools);
                }
                let mut table = Table::new(vec![
                    Column::left("pool"),
                    Column::left("format"),
                    Column::right("volumes"),
                    Column::right("capacity"),
                    Column::right("free"),
                    Column::right("allocated"),
                    Column::right("provisioned"),
                    Column::right("overcommit"),
                    Column::left("state"),
                ]);
                for p in &pools {
                    // A gateway pool's space is its upstream's: nothing to show here.
                    let here = p.format != "upstream";
                    let space = |b: u64| if here { human_size(b) } else { "-".into() };
                    table.add_row([
                        p.name.clone(),
                        p.format.clone(),
                        p.volumes.to_string(),
                        space(p.capacity_bytes),
                        space(p.free_bytes),
                        space(p.allocated_bytes),
                        human_size(p.provisioned_bytes),
                        if here {
                            format!("{:.2}x", p.overcommit_ratio)
                        } else {
                            "-".into()
                        },
                        if !here {
                            "upstream's space".into()
                        } else if p.overcommitted {
                            "OVERCOMMITTED: volumes can outgrow the free space".into()
                        } else {
                            "ok".into()
                        },
                    ]);
                }
                out!("{table}");
                Ok(())
            }
        }
    })
}
