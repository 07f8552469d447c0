//! The API server stand-in as a process, for scripts (the demo): serves Nodes over HTTPS in the
//! network namespace it is started in, until it is killed.
//!
//! kube-apiserver-standin --dir DIR [--listen ADDR:PORT] [--user NAME]... [--netpol-user NAME]...
//!
//! Writes into DIR the CA, the server's certificate, `kubernetes-admin.kubeconfig` (allowed
//! everything), per `--user NAME` a `NAME.kubeconfig` allowed what kube-flannel's ClusterRole
//! allows, and per `--netpol-user NAME` one allowed what flannel-netpol's allows. Prints one
//! line per kubeconfig, then serves.

use std::net::SocketAddr;
use std::path::PathBuf;
use testkit::kube_api::{KubeApi, FLANNEL_RULES, NETPOL_RULES};

fn main() {
    let mut dir: Option<PathBuf> = None;
    let mut listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 6443));
    let mut users = Vec::new();
    let mut netpol_users = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |flag: &str| {
            args.next().unwrap_or_else(|| {
                eprintln!("{flag} needs a value");
                std::process::exit(2)
            })
        };
        match a.as_str() {
            "--dir" => dir = Some(PathBuf::from(value("--dir"))),
            "--listen" => {
                let v = value("--listen");
                listen = v.parse().unwrap_or_else(|e| {
                    eprintln!("--listen {v:?}: {e}");
                    std::process::exit(2)
                })
            }
            "--user" => users.push(value("--user")),
            "--netpol-user" => netpol_users.push(value("--netpol-user")),
            "-h" | "--help" => {
                println!(
                    "usage: kube-apiserver-standin --dir DIR [--listen ADDR:PORT] [--user NAME]... [--netpol-user NAME]..."
                );
                return;
            }
            other => {
                eprintln!("unknown argument {other:?}");
                std::process::exit(2)
            }
        }
    }
    let Some(dir) = dir else {
        eprintln!("--dir is required");
        std::process::exit(2)
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("creating {}: {e}", dir.display());
        std::process::exit(1)
    }
    let mut api = KubeApi::start(None, listen, &dir);
    println!(
        "kubeconfig {} {}",
        api.admin().name,
        api.admin().kubeconfig.display()
    );
    for (u, rules) in users
        .iter()
        .map(|u| (u, FLANNEL_RULES))
        .chain(netpol_users.iter().map(|u| (u, NETPOL_RULES)))
    {
        let user = api.add_user(u, Some(rules));
        println!("kubeconfig {} {}", user.name, user.kubeconfig.display());
    }
    println!("serving {}", api.url());
    loop {
        std::thread::park();
    }
}
