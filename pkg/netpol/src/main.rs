//! flannel-netpol: flags, logging, the API server, then the enforcer's loop or one look
//! (`doctor`).

use clap::Parser;
use flannel_netpol::compile::compile;
use flannel_netpol::doctor::{self, Finding, Look};
use flannel_netpol::flags::{Command, Flags};
use flannel_netpol::model::{Namespace, NetworkPolicy, Pod};
use flannel_netpol::nft::{desired, transaction, TABLE};
use flannel_netpol::objects::{Change, Objects};
use flannel_netpol::{bridge, daemon, flannel, health, kernel};
use kube_lite::{KubeClient, KubeError, Selector, Source, NAMESPACES, NETWORK_POLICIES, PODS};
use std::process::ExitCode;
use tracing::{error, info, warn};

const RIGHTS: &str = "flannel-netpol needs list and watch on namespaces, pods and networkpolicies";

fn init_logs(flags: &Flags) {
    let b = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false);
    if flags.log_format == "json" {
        b.json().flatten_event(true).init();
    } else {
        b.init();
    }
}

async fn connect(flags: &Flags) -> Result<KubeClient, KubeError> {
    let src = Source {
        api_url: flags.kube_api_url.as_deref(),
        kubeconfig: flags.kubeconfig.as_deref(),
        api_url_flag: "--kube-api-url",
        kubeconfig_flag: "--kubeconfig",
    };
    Ok(KubeClient::connect(&src).await?.needing(RIGHTS))
}

/// The cluster, listed once.
async fn list_all(client: &KubeClient) -> Result<Objects, KubeError> {
    let mut o = Objects::default();
    let all = Selector::all();
    o.namespaces_changed(Change::Listed(
        client.list::<Namespace>(NAMESPACES, &all).await?.items,
    ));
    o.pods_changed(Change::Listed(client.list::<Pod>(PODS, &all).await?.items));
    o.policies_changed(Change::Listed(
        client
            .list::<NetworkPolicy>(NETWORK_POLICIES, &all)
            .await?
            .items,
    ));
    Ok(o)
}

/// One look: listed, compiled, compared with the table.
fn look(flags: &Flags, node: &str, objects: &Objects, fix: bool) -> Look {
    let mut findings = vec![Finding {
        ok: true,
        kind: "api",
        detail: format!(
            "listed {} namespaces, {} pods, {} policies",
            objects.namespaces.len(),
            objects.pods.len(),
            objects.policies.len()
        ),
    }];
    let b = bridge::check(fix);
    findings.push(Finding {
        ok: b.is_ok(),
        kind: "bridge",
        detail: b.describe(),
    });
    let masq = flannel::check(&flags.subnet_file);
    findings.push(Finding {
        ok: masq.is_ok(),
        kind: "flannel",
        detail: masq.unwrap_or_else(|e| e),
    });
    let compiled = compile(objects, node);
    for p in &compiled.problems {
        findings.push(Finding {
            ok: false,
            kind: "policy",
            detail: format!("{p}: enforced as allowing nothing"),
        });
    }
    let want = desired(&compiled);
    let (listing, tx) = match kernel::read() {
        Ok(l) => {
            let tx = transaction(&want, l.as_ref().map(|l| &l.table));
            findings.push(Finding {
                ok: tx.is_none(),
                kind: "table",
                detail: match (&l, &tx) {
                    (None, _) => format!("inet {TABLE} is missing"),
                    (Some(_), None) => format!("inet {TABLE} holds what the policies say"),
                    (Some(_), Some(t)) => format!(
                        "inet {TABLE} differs from what the policies say: a transaction of {} lines would mend it",
                        t.lines().count()
                    ),
                },
            });
            (l, tx)
        }
        Err(e) => {
            findings.push(Finding {
                ok: false,
                kind: "table",
                detail: e,
            });
            (None, None)
        }
    };
    Look {
        node: node.to_string(),
        findings,
        compiled,
        listing,
        transaction: tx,
    }
}

async fn doctor(flags: &Flags, node: &str, fix: bool) -> u8 {
    let client = match connect(flags).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    let objects = match list_all(&client).await {
        Ok(o) => o,
        Err(e) => {
            println!("FAIL api      {e}");
            return 1;
        }
    };
    let first = look(flags, node, &objects, false);
    print!("{}", doctor::text(&first, &objects));
    let Some(tx) = first.transaction.as_ref().filter(|_| fix) else {
        return u8::from(first.problems() > 0);
    };
    if let Err(e) = kernel::write(tx) {
        println!("--fix: {e}");
        return 1;
    }
    println!("--fix: wrote the table's difference; looking again:");
    let again = look(flags, node, &objects, true);
    print!("{}", doctor::text(&again, &objects));
    u8::from(again.problems() > 0)
}

async fn serve(flags: &Flags, node: String) -> u8 {
    info!(
        "flannel-netpol {} on node {node}",
        env!("CARGO_PKG_VERSION")
    );
    let b = bridge::check(true);
    if b.is_ok() {
        info!("{}", b.describe());
    } else {
        warn!("{}", b.describe());
    }
    match flannel::check(&flags.subnet_file) {
        Ok(said) => info!("{said}"),
        Err(warning) => warn!("{warning}"),
    }
    if !flags.metrics_bind_address.is_empty() {
        let addr = match flags.metrics_bind_address.parse() {
            Ok(a) => a,
            Err(e) => {
                error!(
                    "--metrics-bind-address {:?}: {e}",
                    flags.metrics_bind_address
                );
                return 2;
            }
        };
        if let Err(e) = health::start(addr).await {
            error!("--metrics-bind-address {addr}: {e}");
            return 2;
        }
    }
    let client = match connect(flags).await {
        Ok(c) => c,
        Err(e) => {
            error!("{e}");
            return 2;
        }
    };
    info!("API server {} as {}", client.server(), client.credentials());
    daemon::run(flags, node, client).await
}

fn main() -> ExitCode {
    let flags = match Flags::try_parse() {
        Ok(f) => f,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    if flags.version {
        println!("flannel-netpol {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    init_logs(&flags);
    let node = match flags.node_name() {
        Ok(n) => n,
        Err(e) => {
            error!("{e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error!("starting the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = rt.block_on(async {
        match &flags.command {
            Some(Command::Doctor { fix }) => doctor(&flags, &node, *fix).await,
            None => serve(&flags, node).await,
        }
    });
    ExitCode::from(code)
}
