//! flannel's `alloc`: subnets handed out, nothing programmed.

use super::api::Backend;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alloc;

impl Backend for Alloc {
    fn name(&self) -> &'static str {
        "alloc"
    }

    fn programs(&self) -> bool {
        false
    }
}
