//! The Go host-local and ours on one dataDir: each sees and releases the other's
//! reservations, and taking turns they never hand out one address twice.

mod common;

use common::*;
use serde_json::json;
use std::collections::BTreeMap;

#[test]
fn addresses_allocated_by_go_are_seen_and_released_by_ours() {
    let Some(go_add) = go("ADD") else { return };
    let net = Net::new();
    let conf = net.conf(
        "1.0.0",
        json!({"ranges": [[{"subnet": "10.70.0.0/24"}], [{"subnet": "fd00:70::/64"}]]}),
    );
    let mut go_ips = Vec::new();
    for i in 0..5 {
        go_ips.extend(addresses(
            &go_add
                .clone()
                .container_id(&format!("go-{i}"))
                .run(&conf)
                .ok(),
        ));
    }
    for i in 0..5 {
        let id = format!("go-{i}");
        ours("CHECK").container_id(&id).run(&conf).ok();
        // Go's reservation counts as held by that attachment.
        let e = ours("ADD").container_id(&id).run(&conf).err(999);
        assert!(e["msg"].as_str().unwrap().contains("duplicate allocation"));
    }
    // Ours continues after Go's last address in each range set.
    let r = ours("ADD").container_id("rust-0").run(&conf).ok();
    assert_eq!(addresses(&r), ["10.70.0.7", "fd00:70::7"]);
    for ip in addresses(&r) {
        assert!(!go_ips.contains(&ip));
    }
    for i in 0..5 {
        ours("DEL").container_id(&format!("go-{i}")).run(&conf).ok();
    }
    let left: Vec<String> = net.reservations().into_values().collect();
    assert_eq!(left, ["rust-0\r\neth0", "rust-0\r\neth0"]);
}

#[test]
fn addresses_allocated_by_ours_are_seen_and_released_by_go() {
    let Some(go_add) = go("ADD") else { return };
    let net = Net::new();
    let conf = net.conf(
        "1.0.0",
        json!({"ranges": [[{"subnet": "10.71.0.0/24"}], [{"subnet": "fd00:71::/64"}]]}),
    );
    let mut ours_ips = Vec::new();
    for i in 0..5 {
        ours_ips.extend(addresses(
            &ours("ADD")
                .container_id(&format!("rust-{i}"))
                .run(&conf)
                .ok(),
        ));
    }
    for i in 0..5 {
        let id = format!("rust-{i}");
        go("CHECK").unwrap().container_id(&id).run(&conf).ok();
        let out = go_add.clone().container_id(&id).run(&conf);
        assert_eq!(out.code, 1, "Go must see the duplicate: {}", out.stdout);
    }
    let r = go_add.clone().container_id("go-0").run(&conf).ok();
    assert_eq!(addresses(&r), ["10.71.0.7", "fd00:71::7"]);
    for i in 0..5 {
        go("DEL")
            .unwrap()
            .container_id(&format!("rust-{i}"))
            .run(&conf)
            .ok();
    }
    let left: Vec<String> = net.reservations().into_values().collect();
    assert_eq!(left, ["go-0\r\neth0", "go-0\r\neth0"]);
    // Ours notices that Go changed the directory behind its index.
    ours("CHECK").container_id("rust-0").run(&conf).err(999);
    ours("CHECK").container_id("go-0").run(&conf).ok();
    ours("DEL").container_id("go-0").run(&conf).ok();
    net.assert_empty();
}

#[test]
fn alternating_on_one_network_never_hands_out_an_address_twice() {
    if go("ADD").is_none() {
        return;
    }
    let net = Net::new();
    // A small range so that it wraps and freed addresses come round again.
    let conf = net.subnet("1.0.0", "10.72.0.0/27");
    let pick = |step: usize, cmd: &str| {
        if step.is_multiple_of(2) {
            ours(cmd)
        } else {
            go(cmd).unwrap()
        }
    };
    let mut held: BTreeMap<String, String> = BTreeMap::new(); // ip -> container
    let mut next_id = 0;
    for step in 0..120 {
        // Mostly ADDs until the range is nearly full, then a release every other step.
        let release = held.len() > 20 || (step % 5 == 4 && !held.is_empty());
        if release {
            let victim = held.keys().nth(step % held.len()).unwrap().clone();
            let id = held.remove(&victim).unwrap();
            pick(step, "DEL").container_id(&id).run(&conf).ok();
        } else {
            let id = format!("alt-{next_id}");
            next_id += 1;
            let ip = address(&pick(step, "ADD").container_id(&id).run(&conf).ok());
            assert!(
                !held.contains_key(&ip),
                "step {step}: {ip} handed to {id} while held by {}",
                held[&ip]
            );
            held.insert(ip, id);
        }
        let on_disk: BTreeMap<String, String> = net
            .reservations()
            .into_iter()
            .map(|(ip, c)| (ip, c.trim_end_matches("\r\neth0").to_string()))
            .collect();
        assert_eq!(on_disk, held, "step {step}");
    }
    for (i, id) in held.values().enumerate() {
        pick(i, "DEL").container_id(id).run(&conf).ok();
    }
    ours("DEL").container_id("none").run(&conf).ok();
    net.assert_empty();
}

#[test]
fn changes_made_behind_our_back_right_after_our_call_are_seen() {
    let net = Net::new();
    let conf = net.subnet("1.0.0", "10.73.0.0/24");
    for round in 0..50 {
        let id = format!("ours-{round}");
        let ip = address(&ours("ADD").container_id(&id).run(&conf).ok());
        // As the Go plugin would, within the same clock tick: a reservation our index never saw...
        let foreign_id = format!("foreign-{round}");
        let foreign_ip = format!("10.73.0.{}", 200 + round % 50);
        net.write_reservation(&foreign_ip, &format!("{foreign_id}\r\neth0"));
        let e = ours("ADD").container_id(&foreign_id).run(&conf).err(999);
        assert!(
            e["msg"].as_str().unwrap().contains(&foreign_ip),
            "round {round}"
        );
        ours("CHECK").container_id(&foreign_id).run(&conf).ok();
        ours("DEL").container_id(&foreign_id).run(&conf).ok();
        assert!(!net.dir().join(&foreign_ip).exists(), "round {round}");
        // ...and a release our index never saw.
        std::fs::remove_file(net.dir().join(&ip)).unwrap();
        ours("CHECK").container_id(&id).run(&conf).err(999);
        ours("ADD").container_id(&id).run(&conf).ok();
        ours("DEL").container_id(&id).run(&conf).ok();
    }
    net.assert_empty();
}
