//! The enforcer's table in the kernel, through the suite's one way of running nftables: read
//! it back (`nft -j list`) and write a transaction (`nft -f`, applied whole or not at all),
//! naming the process that commits it, so that its announcement is known as the enforcer's.

use crate::enforcer::Kernel;
use crate::nft::{parse, Listing, Table, TABLE};
use cni_kernel::firewall::{Nftables, RuleTool};

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

    fn write(&mut self, transaction: &str) -> Result<Option<u32>, String> {
        write(transaction)
    }
}
