//! flanneld: flags, logging, the kernel's view of the interfaces, then the daemon.

use clap::Parser;
use flanneld::daemon::{self, Exit, Settings};
use flanneld::flags::{normalise_args, Flags};
use flanneld::iface::Wanted;
use flanneld::registry::dir::DirRegistry;
use flanneld::registry::etcd::{EtcdOptions, EtcdRegistry};
use flanneld::registry::Registry;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{error, info, warn};

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().collect();
    let doctor = args.get(1).is_some_and(|a| a == "doctor");
    if doctor {
        args.remove(1);
    }
    let flags = match Flags::try_parse_from(normalise_args(args)) {
        Ok(f) => f,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    if flags.version {
        println!("flanneld {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let level = match flags.verbosity {
        0 => tracing::Level::INFO,
        1..=4 => tracing::Level::DEBUG,
        _ => tracing::Level::TRACE,
    };
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .with_max_level(level);
    if flags.log_format == "json" {
        logs.json().flatten_event(true).init();
    } else {
        logs.init();
    }

    if flags.kube_subnet_mgr {
        error!(
            "--kube-subnet-mgr is not supported yet: keep leases in etcd (--etcd-endpoints) or, \
             on one machine, in the embedded registry (--registry-dir)"
        );
        return ExitCode::from(2);
    }
    if flags.etcd_endpoints.is_empty() {
        info!(
            "no --etcd-endpoints given: using the embedded registry in {}",
            flags.registry_dir.display()
        );
    } else {
        info!(
            "leases in etcd at {} under {}",
            flags.etcd_endpoints.join(","),
            flags.etcd_prefix
        );
    }

    // Netlink is read here, synchronously, before the async runtime starts.
    let (links, routes) = match flanneld::iface::gather() {
        Ok(v) => v,
        Err(e) => {
            error!("reading the interfaces and routes: {e}");
            return ExitCode::from(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            error!("starting the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = if doctor {
        runtime.block_on(doctor_run(flags, links, routes))
    } else {
        runtime.block_on(serve(flags, links, routes))
    };
    runtime.shutdown_timeout(Duration::from_secs(1));
    code
}

async fn serve(
    flags: Flags,
    links: Vec<flanneld::iface::LinkFacts>,
    routes: Vec<flanneld::iface::Route>,
) -> ExitCode {
    let ready = Arc::new(AtomicBool::new(false));
    if flags.healthz_port != 0 {
        let addr = SocketAddr::new(flags.healthz_ip, flags.healthz_port);
        if let Err(e) = flanneld::health::start(addr, ready.clone()).await {
            error!("--healthz-ip/--healthz-port {addr}: cannot listen: {e}");
            return ExitCode::from(2);
        }
        info!("health endpoints on http://{addr}/healthz and /readyz");
    }
    let settings = Settings {
        wanted: wanted(&flags),
        links,
        routes,
        subnet_file: flags.subnet_file.clone(),
        ip_masq: flags.ip_masq,
        random_fully: !flags.ip_masq_fully_random_disable,
        forward_rules: flags.iptables_forward_rules,
        iptables_resync: Duration::from_secs(flags.iptables_resync),
        ttl: Duration::from_secs(flags.subnet_lease_ttl),
        renew_margin: Duration::from_secs(u64::from(flags.subnet_lease_renew_margin) * 60),
        ready,
    };
    let exit = if flags.etcd_endpoints.is_empty() {
        match DirRegistry::open(&flags.registry_dir, &flags.net_config_path) {
            Ok(reg) => run(Arc::new(reg), settings).await,
            Err(e) => {
                error!("--registry-dir {}: {e}", flags.registry_dir.display());
                return ExitCode::from(2);
            }
        }
    } else {
        let opts = etcd_options(&flags);
        if let Err(e) = EtcdRegistry::connect_options(&opts) {
            error!("{e}");
            return ExitCode::from(2);
        }
        let mut last_log: Option<Instant> = None;
        let reg = loop {
            match EtcdRegistry::connect(opts.clone()).await {
                Ok(r) => break r,
                Err(e) => {
                    if last_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
                        warn!("{e}; retrying every second");
                        last_log = Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        run(Arc::new(reg), settings).await
    };
    match exit {
        Exit::Stopped => ExitCode::SUCCESS,
        Exit::BadStart(why) => {
            error!("{why}");
            ExitCode::from(2)
        }
        Exit::LeaseLost(why) => {
            error!("{why}: exiting so that the node takes a lease again at its next start");
            ExitCode::from(1)
        }
    }
}

async fn run<R: Registry>(reg: Arc<R>, settings: Settings) -> Exit {
    info!("registry: {}", reg.describe());
    daemon::run(reg, settings).await
}

fn wanted(flags: &Flags) -> Wanted {
    Wanted {
        iface: flags.iface.clone(),
        iface_regex: flags.iface_regex.clone(),
        iface_can_reach: flags.iface_can_reach,
        public_ip: flags.public_ip,
        public_ipv6: flags.public_ipv6,
        ipv4: true,
        ipv6: false,
    }
}

/// `flanneld doctor`: one look at the registry and the kernel, no daemon.
async fn doctor_run(
    flags: Flags,
    links: Vec<flanneld::iface::LinkFacts>,
    routes: Vec<flanneld::iface::Route>,
) -> ExitCode {
    let w = wanted(&flags);
    let masq = (
        flags.ip_masq,
        !flags.ip_masq_fully_random_disable,
        flags.iptables_forward_rules,
    );
    let report = if flags.etcd_endpoints.is_empty() {
        match DirRegistry::open(&flags.registry_dir, &flags.net_config_path) {
            Ok(reg) => {
                flanneld::doctor::examine(&reg, &w, (&links, &routes), &flags.subnet_file, masq)
                    .await
            }
            Err(e) => {
                error!("--registry-dir {}: {e}", flags.registry_dir.display());
                return ExitCode::from(2);
            }
        }
    } else {
        let opts = etcd_options(&flags);
        match EtcdRegistry::connect(opts).await {
            Ok(reg) => {
                flanneld::doctor::examine(&reg, &w, (&links, &routes), &flags.subnet_file, masq)
                    .await
            }
            Err(e) => {
                error!("{e}");
                return ExitCode::from(1);
            }
        }
    };
    if flags.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print!("{}", report.text());
    }
    if report.problems() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn etcd_options(flags: &Flags) -> EtcdOptions {
    EtcdOptions {
        endpoints: flags.etcd_endpoints.clone(),
        prefix: flags.etcd_prefix.trim_end_matches('/').to_string(),
        keyfile: flags.etcd_keyfile.clone(),
        certfile: flags.etcd_certfile.clone(),
        cafile: flags.etcd_cafile.clone(),
        username: flags.etcd_username.clone(),
        password: flags.etcd_password.clone(),
    }
}
