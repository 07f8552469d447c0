//! flanneld: flags, logging, the kernel's view of the interfaces, then the daemon.

use clap::Parser;
use flanneld::daemon::{self, Exit};
use flanneld::doctor;
use flanneld::flags::{normalise_args, DoctorFlags, Flags};
use flanneld::iface::Interfaces;
use flanneld::registry;
use flanneld::settings::{go_environment, Settings};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{error, info, warn};

/// What the command line asks for: the daemon, or one look (`flanneld doctor`).
enum Command {
    Serve(Flags),
    Doctor(DoctorFlags),
}

fn parse(mut args: Vec<String>) -> Result<Command, clap::Error> {
    if args.get(1).is_some_and(|a| a == "doctor") {
        args.remove(1);
        return DoctorFlags::try_parse_from(args).map(Command::Doctor);
    }
    Flags::try_parse_from(normalise_args(args)).map(Command::Serve)
}

/// One malloc arena for every thread. The async work runs on the main thread; a blocking
/// thread with an arena of its own (the kube list's parser) keeps the pages it freed out of the
/// main thread's reach: 5 MiB more RSS at 5,000 Nodes in kube_start.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; no other thread runs yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

fn main() -> ExitCode {
    one_malloc_arena();
    let command = match parse(std::env::args().collect()) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let flags = match &command {
        Command::Serve(f) => f,
        Command::Doctor(d) => &d.flags,
    };
    if flags.version {
        println!("{}", version());
        return ExitCode::SUCCESS;
    }
    init_logs(flags);

    let settings = Settings::from_flags(flags);
    info!("{}", settings.registry.describe());
    for ignored in flags.klog.ignored() {
        warn!("{ignored}");
    }
    match go_environment(flags.kube_subnet_mgr, |k| std::env::var(k).ok()) {
        Ok(notes) => {
            for (warns, note) in notes {
                if warns {
                    warn!("{note}");
                } else {
                    info!("{note}");
                }
            }
        }
        Err(e) => {
            error!("{e}");
            return ExitCode::from(2);
        }
    }

    // Netlink is read here, synchronously, before the async runtime starts.
    let ifaces = match flanneld::iface::gather() {
        Ok(i) => i,
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
    let code = match &command {
        Command::Doctor(d) => runtime.block_on(doctor_run(d, &settings, ifaces)),
        Command::Serve(f) => runtime.block_on(serve(f, &settings, ifaces)),
    };
    runtime.shutdown_timeout(Duration::from_secs(1));
    code
}

/// `<version>-<commit>[-dirty]`, the string the image is tagged with; without a known commit,
/// the version and that it is unknown.
fn version() -> String {
    let revision = env!("FLANNELD_REVISION");
    if revision.is_empty() {
        format!("flanneld {} (commit unknown)", env!("CARGO_PKG_VERSION"))
    } else {
        format!("flanneld {}-{revision}", env!("CARGO_PKG_VERSION"))
    }
}

fn init_logs(flags: &Flags) {
    use tracing_subscriber::filter::filter_fn;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let plan = flags.klog.plan();
    let max = plan.max_level();
    // The libraries' own lines (kube-rs's `failed with error client error (Connect)`) say
    // less than the daemon's line about the same failure: they show only from -v=1 on.
    let libraries = flags.klog.verbosity > 0;
    let filter = filter_fn(move |m| {
        let ours = ["flanneld", "kube_lite", "wireguard", "tunio"]
            .iter()
            .any(|c| m.target().starts_with(c));
        (libraries || ours) && plan.enabled(m.target(), m.level())
    })
    .with_max_level_hint(max);
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false);
    let layer = if flags.log_format == "json" {
        layer.json().flatten_event(true).with_filter(filter).boxed()
    } else {
        layer.with_filter(filter).boxed()
    };
    tracing_subscriber::registry().with(layer).init();
}

async fn serve(flags: &Flags, settings: &Settings, ifaces: Interfaces) -> ExitCode {
    let ready = Arc::new(AtomicBool::new(false));
    tokio::spawn(flanneld::readiness::tell_systemd(
        ready.clone(),
        Instant::now(),
        settings.registry.waited_for(),
        settings.subnet_file.clone(),
    ));
    if flags.healthz_port != 0 {
        let addr = SocketAddr::new(flags.healthz_ip, flags.healthz_port);
        if let Err(e) = flanneld::health::start(addr, ready.clone()).await {
            error!("--healthz-ip/--healthz-port {addr}: cannot listen: {e}");
            return ExitCode::from(2);
        }
        info!("health endpoints on http://{addr}/healthz and /readyz");
    }
    let reg = match registry::open(&settings.registry).await {
        Ok(r) => r,
        Err(e) => {
            error!("{e}");
            return ExitCode::from(2);
        }
    };
    info!("registry: {}", reg.describe());
    let exit = daemon::run(reg, settings, ifaces, ready).await;
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

/// `flanneld doctor`: one look at the registry and the kernel, no daemon.
async fn doctor_run(flags: &DoctorFlags, settings: &Settings, ifaces: Interfaces) -> ExitCode {
    let reg = match registry::open_to_read(&settings.registry).await {
        Ok(r) => r,
        Err(e) => {
            error!("{e}");
            return ExitCode::from(2);
        }
    };
    let report = doctor::examine(reg.as_ref(), settings, &ifaces, flags.fix).await;
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
