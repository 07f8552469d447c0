//! The enforcer's table in the kernel, through the suite's one way of running nftables: read
//! it back (`nft -j list`) and write a transaction (`nft -f`, applied whole or not at all).

use crate::nft::{parse, Listing, TABLE};
use cni_kernel::firewall::{Nftables, RuleTool};

/// The table as the kernel holds it; None when there is none.
pub fn read() -> Result<Option<Listing>, String> {
    let json = Nftables
        .list(&["table", "inet", TABLE])
        .map_err(|e| format!("reading table inet {TABLE}: {e}"))?;
    json.map(|j| parse(&j)).transpose()
}

/// Applies one transaction.
pub fn write(transaction: &str) -> Result<(), String> {
    Nftables
        .apply(transaction)
        .map_err(|e| format!("writing table inet {TABLE}: {e}"))
}
