//! `flanneld doctor`: what the daemon would find, with nothing written. It brings the node up
//! as the daemon does (`bringup::prepare`, reading once and waiting for nothing), then prints
//! each plane's plan: the devices and each other node's entries, subnet.env and the MTU chain,
//! the masquerade rules. `--fix` then applies the plans it printed, once, and looks again.

use crate::bringup::{prepare, Level, Note, Prepared, Purpose};
use crate::iface::Interfaces;
use crate::planes::{Looked, Others};
use crate::registry::Registry;
use crate::report::{Finding, Report};
use crate::settings::Settings;
use serde::Serialize;
use std::sync::Arc;

/// What `doctor` prints: the look, and with `--fix` the look after the fix.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Examination {
    #[serde(flatten)]
    pub before: Report,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_fix: Option<Report>,
}

impl Examination {
    /// What is still wrong: after the fix when there was one.
    pub fn problems(&self) -> usize {
        self.after_fix.as_ref().unwrap_or(&self.before).problems()
    }

    pub fn text(&self) -> String {
        let mut out = self.before.text();
        if let Some(after) = &self.after_fix {
            out.push_str("--fix: wrote what was missing or wrong; looking again:\n");
            out.push_str(&after.text());
        }
        out
    }
}

/// A step of the bring-up as a finding.
fn finding(n: Note) -> Finding {
    let state = match n.level {
        Level::Fine | Level::Notice => "ok",
        Level::Wrong => "wrong",
    };
    Finding::new(n.kind, state, n.text)
}

/// One look: the findings, and the node and its planes' plans when it got that far.
async fn look(
    reg: &dyn Registry,
    settings: &Settings,
    ifaces: &Interfaces,
) -> (Report, Option<(Prepared, Vec<Looked>)>) {
    let mut findings = Vec::new();
    let prepared = prepare(settings, reg, ifaces, &Purpose::Examine, &mut |n| {
        findings.push(finding(n))
    })
    .await;
    let mut report = Report { findings };
    let mut up = match prepared {
        Ok(up) => up,
        Err(e) => {
            report
                .findings
                .push(Finding::new(e.kind(), e.state(), e.to_string()));
            return (report, None);
        }
    };
    let others = others(&up);
    let mut looks = Vec::new();
    for plane in &mut up.planes {
        let mut looked = plane.look(&others).await;
        report.findings.append(&mut looked.findings);
        looks.push(looked);
    }
    (report, Some((up, looks)))
}

/// The other nodes' leases as the daemon's passes have them.
fn others(up: &Prepared) -> Others {
    Others::Known {
        leases: Arc::new(up.others.clone()),
        changed: true,
    }
}

/// The whole check; with `fix`, when anything is wrong, every plan it printed applied, and
/// a second look.
pub async fn examine(
    reg: &dyn Registry,
    settings: &Settings,
    ifaces: &Interfaces,
    fix: bool,
) -> Examination {
    let (before, found) = look(reg, settings, ifaces).await;
    let Some((mut up, looks)) = found.filter(|_| fix && before.problems() > 0) else {
        return Examination {
            before,
            after_fix: None,
        };
    };
    let others = others(&up);
    for (plane, looked) in up.planes.iter_mut().zip(looks) {
        plane.fix(looked, &others).await;
    }
    let (after, _) = look(reg, settings, ifaces).await;
    Examination {
        before,
        after_fix: Some(after),
    }
}
