//! The enforcer's table in the kernel, through the suite's one way of running nftables: read
//! it back (`nft -j list`) and write a transaction (`nft -f`, applied whole or not at all),
//! naming the process that commits it, so that its announcement is known as the enforcer's.
//! Element changes go in one nfnetlink batch of their own (`nft` would read every element of
//! the table before writing one).

use crate::enforcer::Kernel;
use crate::nft::{parse, Listing, Plan, Table, TABLE};
use crate::ranges::Family;
use cni_kernel::firewall::{Nftables, RuleTool};
use cni_kernel::nft_elements::Batch;

/// The table as the kernel holds it, with its drop counters; None when there is none.
pub fn read() -> Result<Option<Listing>, String> {
    let json = Nftables
        .list(&["table", "inet", TABLE])
        .map_err(|e| format!("reading table inet {TABLE}: {e}"))?;
    json.map(|j| parse(&j)).transpose()
}

/// Applies one transaction; the id of the `nft` that committed it.
pub fn write(transaction: &str) -> Result<Option<u32>, String> {
    let nft = Nftables
        .prime()
        .map_err(|e| format!("writing table inet {TABLE}: {e}"))?;
    let pid = nft.pid();
    nft.apply(transaction)
        .map_err(|e| format!("writing table inet {TABLE}: {e}"))?;
    Ok(pid)
}

/// The kernel of this process's network namespace.
pub struct Nft;

impl Kernel for Nft {
    fn read(&mut self) -> Result<Option<Table>, String> {
        Ok(read()?.map(|l| l.table))
    }

    fn write(&mut self, plan: &Plan) -> Result<Vec<u32>, String> {
        match plan {
            Plan::Whole(text) => Ok(write(text)?.into_iter().collect()),
            Plan::Steps {
                before,
                sets,
                elements,
                after,
            } => {
                let mut pids = Vec::new();
                if !before.is_empty() {
                    pids.extend(write(before)?);
                }
                if !sets.is_empty() || !elements.is_empty() {
                    let mut batch = Batch::new("inet", TABLE).map_err(|e| e.to_string())?;
                    for (name, family) in sets {
                        batch.add_interval_set(name, *family == Family::V6);
                    }
                    for e in elements {
                        if e.add {
                            batch.add(&e.name, &e.elems);
                        } else {
                            batch.delete(&e.name, &e.elems);
                        }
                    }
                    pids.push(batch.commit().map_err(|e| e.to_string())?);
                }
                if !after.is_empty() {
                    pids.extend(write(after)?);
                }
                Ok(pids)
            }
        }
    }
}
