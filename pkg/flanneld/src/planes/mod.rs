//! The planes of the node's state that the reconciler keeps: the datapath's netlink entries
//! and devices, subnet.env, the firewall's rules and `--ip-blackhole-route`'s routes. Each
//! plans (reads what is held, and diffs it against what should be: a [`Plan`], nothing
//! written) and applies a plan; the daemon applies every plan, `flanneld doctor` prints them,
//! and `doctor --fix` applies what it printed.

pub mod blackhole;
pub mod firewall;
pub mod netlink;
pub mod subnet_env;

use crate::lease::{Lease, SubnetKey};
use crate::report::Finding;
use cni_kernel::netlink::Event as NlEvent;
use futures::future::BoxFuture;
use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The other nodes' leases, by subnet.
pub type Leases = BTreeMap<SubnetKey, Arc<Lease>>;

/// What a pass knows of the other nodes.
#[derive(Debug, Clone)]
pub enum Others {
    /// Nothing yet: the start's pass, before the registry was listed.
    Unknown,
    Known {
        leases: Arc<Leases>,
        /// Whether they changed since the plane's last pass: what it writes without a change
        /// is a repair.
        changed: bool,
    },
}

impl Others {
    pub fn leases(&self) -> Option<&Leases> {
        match self {
            Others::Unknown => None,
            Others::Known { leases, .. } => Some(leases),
        }
    }
}

/// What a plane found to write: the difference between what is held and what should be.
pub trait Plan: Send + 'static {
    fn is_empty(&self) -> bool;

    /// Each thing the plane keeps as the plan found it: ok, missing, wrong or extra, with the
    /// devices named.
    fn findings(&self) -> Vec<Finding>;
}

/// One part of the node's state, kept equal to what it should be.
pub trait Plane: Send + 'static {
    type Plan: Plan;

    /// How `doctor` names what the plane could not read.
    const KIND: &'static str;

    /// How often it is looked at when nothing else asks.
    fn resync(&self) -> Duration;

    /// Whether the other nodes' leases make a difference to it.
    fn follows_leases(&self) -> bool {
        false
    }

    /// Whether netlink notifications can concern it.
    fn listens(&self) -> bool {
        false
    }

    /// Whether this notification concerns what it owns.
    fn concerns(&self, _ev: &NlEvent) -> bool {
        false
    }

    /// Reads what is held and diffs it against what should be; writes nothing.
    fn plan(
        &mut self,
        others: &Others,
    ) -> impl Future<Output = Result<Self::Plan, PassError>> + Send;

    /// Writes a plan; logs what it wrote and what failed.
    fn apply(&mut self, plan: Self::Plan, others: &Others) -> impl Future<Output = ()> + Send;

    /// Logs a pass that could not plan.
    fn failed(&mut self, e: PassError, others: &Others);
}

/// A look at a plane: its findings, and the plan they came from for [`DynPlane::fix`].
pub struct Looked {
    pub findings: Vec<Finding>,
    plan: Option<Box<dyn Any + Send>>,
}

impl Looked {
    /// Whether the look found anything to write.
    pub fn wants_writes(&self) -> bool {
        self.plan.is_some()
    }
}

/// A plane whatever its plan's type, as the reconciler and `doctor` hold it.
pub trait DynPlane: Send + 'static {
    fn resync(&self) -> Duration;
    fn follows_leases(&self) -> bool;
    fn listens(&self) -> bool;
    fn concerns(&self, ev: &NlEvent) -> bool;

    /// One pass: plans, and applies the plan.
    fn pass(&mut self, others: Others) -> BoxFuture<'_, ()>;

    /// Plans and says what the plan found, writing nothing.
    fn look<'a>(&'a mut self, others: &'a Others) -> BoxFuture<'a, Looked>;

    /// Applies the plan of a look.
    fn fix<'a>(&'a mut self, looked: Looked, others: &'a Others) -> BoxFuture<'a, ()>;
}

impl<P: Plane> DynPlane for P {
    fn resync(&self) -> Duration {
        Plane::resync(self)
    }

    fn follows_leases(&self) -> bool {
        Plane::follows_leases(self)
    }

    fn listens(&self) -> bool {
        Plane::listens(self)
    }

    fn concerns(&self, ev: &NlEvent) -> bool {
        Plane::concerns(self, ev)
    }

    fn pass(&mut self, others: Others) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            match self.plan(&others).await {
                Ok(plan) => self.apply(plan, &others).await,
                Err(e) => self.failed(e, &others),
            }
        })
    }

    fn look<'a>(&'a mut self, others: &'a Others) -> BoxFuture<'a, Looked> {
        Box::pin(async move {
            match self.plan(others).await {
                Ok(plan) => Looked {
                    findings: plan.findings(),
                    plan: (!plan.is_empty()).then(|| Box::new(plan) as Box<dyn Any + Send>),
                },
                Err(e) => Looked {
                    findings: vec![Finding::new(P::KIND, "wrong", e.to_string())],
                    plan: None,
                },
            }
        })
    }

    fn fix<'a>(&'a mut self, looked: Looked, others: &'a Others) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Some(plan) = looked.plan.and_then(|p| p.downcast::<P::Plan>().ok()) {
                self.apply(*plan, others).await;
            }
        })
    }
}

/// A plane's pass that failed: the kernel layer's error, or the blocking task that ran the
/// firewall tools ended without an answer.
#[derive(Debug)]
pub enum PassError {
    Kernel(cni_kernel::Error),
    Task(tokio::task::JoinError),
}

impl fmt::Display for PassError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PassError::Kernel(e) => e.fmt(f),
            PassError::Task(why) => write!(f, "the check failed: {why}"),
        }
    }
}

impl std::error::Error for PassError {}

impl From<cni_kernel::Error> for PassError {
    fn from(e: cni_kernel::Error) -> PassError {
        PassError::Kernel(e)
    }
}

impl From<tokio::task::JoinError> for PassError {
    fn from(e: tokio::task::JoinError) -> PassError {
        PassError::Task(e)
    }
}
