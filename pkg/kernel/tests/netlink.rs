//! Every netlink operation against the real kernel, in a throwaway namespace, read back both
//! through the layer and through iproute2 (what an operator would look at).

use cni_kernel::netlink::{
    BridgeSpec, Conn, Event, Events, FdbEntry, LinkKind, LinkSpec, Neighbour, Netlink, Nexthop,
    Route, Vxlan, Write, PROTOCOL_BOOT,
};
use cni_kernel::{Kind, Netns};
use futures::StreamExt;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};
use testkit::TestNs;

fn open(ns: &TestNs) -> (Netns, Netlink) {
    let handle = Netns::open(ns.path()).unwrap();
    let nl = Netlink::open_in(&handle).unwrap();
    (handle, nl)
}

/// An underlay `under0` (a veth: this kernel has no dummy devices) with 192.168.50.1/24, up.
fn underlay(ns: &TestNs, nl: &Netlink) -> u32 {
    ns.ip(&[
        "link", "add", "under0", "type", "veth", "peer", "name", "under1",
    ]);
    ns.ip(&["addr", "add", "192.168.50.1/24", "dev", "under0"]);
    ns.ip(&["link", "set", "under0", "up"]);
    nl.link_by_name("under0").unwrap().unwrap().index
}

fn vxlan_attrs(device: u32) -> Vxlan {
    Vxlan {
        vni: 1,
        port: 8472,
        local: Some("192.168.50.1".parse().unwrap()),
        device: Some(device),
        learning: false,
        gbp: false,
    }
}

fn vxlan_spec(device: u32) -> LinkSpec {
    LinkSpec {
        name: "flannel.1".into(),
        kind: LinkKind::Vxlan(vxlan_attrs(device)),
        mtu: Some(1450),
        mac: Some([0x0e, 0, 0, 0, 0, 1]),
    }
}

/// The vxlan device of `vxlan_spec`, up, and its index.
fn overlay(ns: &TestNs, nl: &Netlink) -> u32 {
    let under = underlay(ns, nl);
    let (link, changed) = nl.ensure_link(&vxlan_spec(under)).unwrap();
    assert!(changed);
    nl.set_up(link.index, true).unwrap();
    link.index
}

#[test]
fn a_bridge_and_its_addresses_are_made_once_and_removed_once() {
    let ns = TestNs::new("kbr");
    let (_h, nl) = open(&ns);
    let spec = BridgeSpec {
        name: "br-k",
        mtu: Some(1400),
        promisc: true,
        vlan_filtering: false,
        mac: [0x0a, 0x58, 0, 0, 0, 1],
    };
    assert!(nl.create_bridge(&spec).unwrap());
    assert!(
        !nl.create_bridge(&spec).unwrap(),
        "a second create changes nothing"
    );
    let br = nl.link_by_name("br-k").unwrap().unwrap();
    assert!(br.is_bridge(), "{br:?}");
    nl.set_promisc(br.index, true).unwrap();
    nl.set_up(br.index, true).unwrap();
    let br = nl.link_by_index(br.index).unwrap().unwrap();
    assert!(br.promisc && br.up, "{br:?}");
    assert_eq!(
        (br.mtu, br.mac_string().as_str()),
        (Some(1400), "0a:58:00:00:00:01")
    );
    let shown = ns.link("br-k").unwrap();
    assert_eq!(shown["linkinfo"]["info_kind"], "bridge");

    let addr = "10.44.0.1/16".parse().unwrap();
    assert!(nl.add_address(br.index, addr).unwrap());
    assert!(!nl.add_address(br.index, addr).unwrap());
    assert_eq!(ns.addresses("br-k"), ["10.44.0.1/16"]);
    assert_eq!(nl.addresses(br.index).unwrap(), [addr]);
    assert!(nl.del_address(br.index, addr).unwrap());
    assert!(!nl.del_address(br.index, addr).unwrap());
    assert!(ns.addresses("br-k").is_empty());

    assert!(nl.delete_link(br.index).unwrap());
    assert!(!nl.delete_link(br.index).unwrap());
    assert!(ns.link("br-k").is_none());
    assert_eq!(nl.link_by_name("br-k").unwrap(), None);
}

#[test]
fn a_vxlan_device_is_made_read_back_compared_and_mended() {
    let ns = TestNs::new("kvx");
    let (_h, nl) = open(&ns);
    let under = underlay(&ns, &nl);
    let spec = vxlan_spec(under);
    let (made, changed) = nl.ensure_link(&spec).unwrap();
    assert!(changed);
    assert!(
        spec.differences(&made).is_empty(),
        "{:?}",
        spec.differences(&made)
    );
    assert_eq!(made.vxlan.as_ref().unwrap(), &vxlan_attrs(under));
    // What iproute2 sees.
    let shown = ns.link("flannel.1").unwrap();
    let data = &shown["linkinfo"]["info_data"];
    assert_eq!(data["id"], 1);
    assert_eq!(data["port"], 8472);
    assert_eq!(data["local"], "192.168.50.1");
    assert_eq!(data["learning"], false);
    assert_eq!(shown["mtu"], 1450);
    assert_eq!(shown["address"], "0e:00:00:00:00:01");

    let (again, changed) = nl.ensure_link(&spec).unwrap();
    assert!(!changed, "the same spec changes nothing");
    assert_eq!(again.index, made.index);

    // MTU is mended in place: same device.
    let mtu = LinkSpec {
        mtu: Some(1400),
        ..spec.clone()
    };
    assert!(!mtu.differences(&again).is_empty() && mtu.mendable(&again));
    let (mended, changed) = nl.ensure_link(&mtu).unwrap();
    assert!(changed);
    assert_eq!((mended.index, mended.mtu), (made.index, Some(1400)));

    // Another VNI or GBP cannot be set on a live device: it is made again.
    let other = LinkSpec {
        kind: LinkKind::Vxlan(Vxlan {
            vni: 7,
            gbp: true,
            ..vxlan_attrs(under)
        }),
        ..mtu.clone()
    };
    assert!(!other.mendable(&mended));
    let (remade, changed) = nl.ensure_link(&other).unwrap();
    assert!(changed);
    assert_ne!(remade.index, made.index);
    assert_eq!(
        remade.vxlan.as_ref().map(|v| (v.vni, v.gbp)),
        Some((7, true))
    );
    let shown = ns.link("flannel.1").unwrap();
    assert_eq!(shown["linkinfo"]["info_data"]["id"], 7);

    // A link of that name that is no vxlan device is not taken over.
    ns.ip(&["link", "add", "vx-taken", "type", "bridge"]);
    let taken = LinkSpec {
        name: "vx-taken".into(),
        ..spec.clone()
    };
    let e = nl.ensure_link(&taken).unwrap_err();
    assert_eq!(e.kind(), Kind::Invalid, "{e}");
    assert!(e.to_string().contains("vx-taken"), "{e}");
    assert!(ns.link("vx-taken").is_some());
}

#[test]
fn a_kind_the_kernel_makes_by_name_needs_nothing_of_its_own() {
    let ns = TestNs::new("knk");
    let (_h, nl) = open(&ns);
    let spec = LinkSpec {
        name: "named0".into(),
        kind: LinkKind::Named("bridge"),
        mtu: Some(1400),
        mac: Some([0x0e, 0, 0, 0, 0, 2]),
    };
    let (made, changed) = nl.ensure_link(&spec).unwrap();
    assert!(changed && spec.differences(&made).is_empty());
    let shown = ns.link("named0").unwrap();
    assert_eq!(shown["linkinfo"]["info_kind"], "bridge");
    assert_eq!(
        (shown["mtu"].as_u64(), shown["address"].as_str()),
        (Some(1400), Some("0e:00:00:00:00:02"))
    );
    assert!(!nl.create_link(&spec).unwrap(), "made once");
    // A kind this kernel lacks is refused by the kernel, naming the device.
    let absent = LinkSpec {
        name: "named1".into(),
        kind: LinkKind::Named("no-such-kind"),
        mtu: None,
        mac: None,
    };
    let e = nl.create_link(&absent).unwrap_err();
    assert!(e.to_string().contains("named1"), "{e}");
}

/// The permanent entries of `dev`: the kernel adds its own (IPv6 multicast, NOARP) once the
/// device is up.
fn permanent_neighbours(nl: &Netlink, dev: u32) -> Vec<Neighbour> {
    let mut all = nl.neighbours(dev).unwrap();
    all.retain(|n| n.permanent);
    all
}

#[test]
fn permanent_neighbours_are_added_replaced_listed_and_deleted() {
    let ns = TestNs::new("kne");
    let (_h, nl) = open(&ns);
    let dev = overlay(&ns, &nl);
    let ip: IpAddr = "10.5.3.0".parse().unwrap();
    let n = Neighbour::permanent(dev, ip, [0x0e, 1, 2, 3, 4, 5]);
    assert!(nl.create_neighbour(&n).unwrap());
    assert!(!nl.create_neighbour(&n).unwrap());
    assert!(!nl.replace_neighbour(&n).unwrap(), "already so");
    assert_eq!(nl.neighbour(dev, ip).unwrap(), Some(n.clone()));
    let moved = Neighbour::permanent(dev, ip, [0x0e, 9, 9, 9, 9, 9]);
    assert!(nl.replace_neighbour(&moved).unwrap());
    assert_eq!(permanent_neighbours(&nl, dev), std::slice::from_ref(&moved));
    let shown = ns.ip("neigh show dev flannel.1"
        .split(' ')
        .collect::<Vec<_>>()
        .as_slice());
    assert!(
        shown.contains("10.5.3.0 lladdr 0e:09:09:09:09:09 PERMANENT"),
        "{shown}"
    );
    let v6 = Neighbour::permanent(dev, "fd00:5::1".parse().unwrap(), [0x0e, 1, 1, 1, 1, 1]);
    assert!(nl.replace_neighbour(&v6).unwrap());
    assert_eq!(permanent_neighbours(&nl, dev).len(), 2);
    assert!(nl.delete_neighbour(dev, ip).unwrap());
    assert!(!nl.delete_neighbour(dev, ip).unwrap());
    assert_eq!(nl.neighbour(dev, ip).unwrap(), None);
    assert_eq!(permanent_neighbours(&nl, dev), [v6]);
}

#[test]
fn fdb_entries_are_added_replaced_listed_and_deleted() {
    let ns = TestNs::new("kfd");
    let (_h, nl) = open(&ns);
    let dev = overlay(&ns, &nl);
    let mac = [0x0e, 1, 2, 3, 4, 5];
    let e = FdbEntry::permanent(dev, mac, "192.168.50.2".parse().unwrap());
    assert!(nl.add_fdb(&e).unwrap());
    assert!(!nl.add_fdb(&e).unwrap(), "already so");
    assert_eq!(nl.fdb_entry(dev, mac).unwrap(), Some(e.clone()));
    let moved = FdbEntry::permanent(dev, mac, "192.168.50.3".parse().unwrap());
    assert!(nl.add_fdb(&moved).unwrap());
    let mine: Vec<FdbEntry> = nl
        .fdb(dev)
        .unwrap()
        .into_iter()
        .filter(|f| f.mac == mac)
        .collect();
    assert_eq!(mine, std::slice::from_ref(&moved));
    let shown = ns.run("bridge", &["fdb", "show", "dev", "flannel.1"]);
    assert!(
        shown.contains("0e:01:02:03:04:05 dst 192.168.50.3 self permanent"),
        "{shown}"
    );
    assert!(nl.delete_fdb(&moved).unwrap());
    assert!(!nl.delete_fdb(&moved).unwrap());
    assert_eq!(nl.fdb_entry(dev, mac).unwrap(), None);
    assert!(!ns
        .run("bridge", &["fdb", "show", "dev", "flannel.1"])
        .contains("0e:01:02:03:04:05"));
}

#[test]
fn onlink_routes_are_created_replaced_listed_and_deleted() {
    let ns = TestNs::new("krt");
    let (_h, nl) = open(&ns);
    let dev = overlay(&ns, &nl);
    let r = Route::new(
        "10.5.3.0/24".parse().unwrap(),
        Some("10.5.3.0".parse().unwrap()),
        Some(dev),
    )
    .onlink();
    assert!(nl.create_route(&r).unwrap());
    assert!(!nl.create_route(&r).unwrap());
    assert!(!nl.replace_route(&r).unwrap(), "already so");
    assert!(nl.routes().unwrap().contains(&r));
    let shown = ns.ip(&["route", "show", "10.5.3.0/24"]);
    assert!(
        shown.contains("10.5.3.0/24 via 10.5.3.0 dev flannel.1") && shown.contains("onlink"),
        "{shown}"
    );
    let moved = Route {
        gw: Some("10.5.3.1".parse().unwrap()),
        ..r.clone()
    };
    assert!(nl.replace_route(&moved).unwrap());
    let here: Vec<Route> = nl
        .routes()
        .unwrap()
        .into_iter()
        .filter(|x| x.dst == r.dst)
        .collect();
    assert_eq!(here, std::slice::from_ref(&moved));
    // A table of its own.
    let other = Route {
        table: 1000,
        ..r.clone()
    };
    assert!(nl.create_route(&other).unwrap());
    assert_eq!(nl.table_routes(1000).unwrap(), std::slice::from_ref(&other));
    assert!(ns
        .ip(&["route", "show", "table", "1000"])
        .contains("10.5.3.0/24"));
    assert!(nl.delete_route(&moved).unwrap());
    assert!(!nl.delete_route(&moved).unwrap());
    assert!(nl.delete_route(&other).unwrap());
    assert!(ns.ip(&["route", "show", "10.5.3.0/24"]).trim().is_empty());
}

#[test]
fn nexthops_are_set_listed_replaced_in_place_and_deleted_with_their_routes() {
    let ns = TestNs::new("knh");
    let (_h, nl) = open(&ns);
    let dev = overlay(&ns, &nl);
    assert!(nl.supports_nexthops().unwrap());
    let v4 = Nexthop::onlink(7, "10.5.3.0".parse().unwrap(), dev);
    let v6 = Nexthop::onlink(8, "fd00:5:3::".parse().unwrap(), dev);
    assert_eq!(v4.protocol, PROTOCOL_BOOT);
    for nh in [&v4, &v6] {
        assert!(nl.set_nexthop(nh).unwrap());
        assert!(!nl.set_nexthop(nh).unwrap(), "already so");
        assert_eq!(nl.nexthop(nh.id).unwrap().as_ref(), Some(nh));
    }
    assert_eq!(nl.nexthops().unwrap(), [v4.clone(), v6.clone()]);
    assert_eq!(nl.nexthop(9).unwrap(), None);
    // What iproute2 sees.
    let shown = ns.ip_json(&["-d", "nexthop", "show"]);
    assert_eq!(shown[0]["id"], 7);
    assert_eq!(shown[0]["gateway"], "10.5.3.0");
    assert_eq!(shown[0]["dev"], "flannel.1");
    assert_eq!(shown[0]["protocol"], "boot");
    assert_eq!(shown[0]["flags"][0], "onlink");
    assert_eq!(shown[1]["gateway"], "fd00:5:3::");

    // A plain route to the subnet is replaced by one through the nexthop (one entry all along).
    let plain = Route::new(
        "10.5.3.0/24".parse().unwrap(),
        Some("10.5.3.0".parse().unwrap()),
        Some(dev),
    )
    .onlink();
    assert!(nl.create_route(&plain).unwrap());
    let r4 = Route::via_nexthop("10.5.3.0/24".parse().unwrap(), 7);
    let r6 = Route::via_nexthop("fd00:5:3::/64".parse().unwrap(), 8);
    assert!(nl.replace_route(&r4).unwrap());
    assert!(nl.replace_route(&r6).unwrap());
    assert!(!nl.replace_routes(&[r4.clone(), r6.clone()]).unwrap()[0]);
    let through: Vec<Route> = nl
        .routes()
        .unwrap()
        .into_iter()
        .filter(|r| r.nhid.is_some())
        .collect();
    assert_eq!(through, [r4.clone(), r6.clone()]);
    assert!(!nl.routes().unwrap().contains(&plain));
    let shown = ns.ip(&["route", "show", "10.5.3.0/24"]);
    assert!(
        shown.starts_with("10.5.3.0/24 nhid 7 via 10.5.3.0 dev flannel.1"),
        "{shown}"
    );

    // Replaced in place: the routes through it stay.
    let moved = Nexthop {
        gateway: "10.5.3.1".parse().unwrap(),
        ..v4.clone()
    };
    assert!(nl.set_nexthop(&moved).unwrap());
    assert!(ns
        .ip(&["route", "show", "10.5.3.0/24"])
        .contains("nhid 7 via 10.5.3.1"));

    // Deleted, with the routes through it.
    assert!(nl.delete_nexthop(7).unwrap());
    assert!(!nl.delete_nexthop(7).unwrap());
    assert!(ns.ip(&["route", "show", "10.5.3.0/24"]).trim().is_empty());
    assert!(nl.routes().unwrap().contains(&r6));
    assert!(nl.delete_route(&r6).unwrap());
    assert_eq!(nl.nexthops().unwrap(), [v6]);
    // A route through a nexthop the kernel does not have is refused, naming it.
    let e = nl.replace_route(&r4).unwrap_err();
    assert!(e.to_string().contains("nhid 7"), "{e}");
}

/// Waits (bounded) for the first event `want` accepts.
async fn seen(events: &mut Events, what: &str, want: impl Fn(&Event) -> bool) {
    let deadline = Duration::from_secs(5);
    let found = tokio::time::timeout(deadline, async {
        while let Some(e) = events.next().await {
            if want(&e) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        found,
        Ok(true),
        "no notification of {what} within {deadline:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn entries_deleted_by_hand_are_announced() {
    let ns = TestNs::new("kev");
    let handle = Netns::open(ns.path()).unwrap();
    let conn = Conn::open_in(&handle).unwrap();
    let mut events = Events::subscribe_in(&handle).unwrap();
    ns.ip(&[
        "link", "add", "under0", "type", "veth", "peer", "name", "under1",
    ]);
    ns.ip(&["link", "set", "under0", "up"]);
    let dev = conn.link_by_name("under0").await.unwrap().unwrap().index;
    seen(
        &mut events,
        "under0 made",
        |e| matches!(e, Event::Link { link, removed: false } if link.name == "under0"),
    )
    .await;

    let ip: IpAddr = "192.168.60.9".parse().unwrap();
    let n = Neighbour::permanent(dev, ip, [0x0e, 0, 0, 0, 0, 9]);
    assert!(conn.replace_neighbour(&n).await.unwrap());
    ns.ip(&["neigh", "del", "192.168.60.9", "dev", "under0"]);
    seen(
        &mut events,
        "the neighbour deleted by hand",
        |e| matches!(e, Event::Neighbour { neighbour, removed: true } if neighbour.ip == ip),
    )
    .await;

    let addr = "192.168.60.1/24".parse().unwrap();
    assert!(conn.add_address(dev, addr).await.unwrap());
    let r = Route::new(
        "10.77.0.0/16".parse().unwrap(),
        Some("192.168.60.254".parse().unwrap()),
        Some(dev),
    );
    assert!(conn.create_route(&r).await.unwrap());
    ns.ip(&["route", "del", "10.77.0.0/16"]);
    seen(
        &mut events,
        "the route deleted by hand",
        |e| matches!(e, Event::Route { route, removed: true } if route.dst == r.dst),
    )
    .await;
    ns.ip(&["addr", "del", "192.168.60.1/24", "dev", "under0"]);
    seen(
        &mut events,
        "the address deleted by hand",
        |e| matches!(e, Event::Address { address, removed: true, .. } if *address == addr),
    )
    .await;

    ns.ip(&[
        "link", "add", "vx9", "type", "vxlan", "id", "9", "dstport", "8472", "dev", "under0",
    ]);
    let vx = conn.link_by_name("vx9").await.unwrap().unwrap().index;
    let f = FdbEntry::permanent(vx, [0x0e, 0, 0, 0, 0, 7], "192.168.60.7".parse().unwrap());
    assert!(conn.add_fdb(&f).await.unwrap());
    ns.run(
        "bridge",
        &[
            "fdb",
            "del",
            "0e:00:00:00:00:07",
            "dev",
            "vx9",
            "dst",
            "192.168.60.7",
        ],
    );
    seen(
        &mut events,
        "the FDB entry deleted by hand",
        |e| matches!(e, Event::Fdb { entry, removed: true } if entry.mac == f.mac),
    )
    .await;

    ns.ip(&["link", "set", "vx9", "up"]);
    let nh = Nexthop::onlink(77, "10.78.0.0".parse().unwrap(), vx);
    assert!(conn.set_nexthop(&nh).await.unwrap());
    seen(
        &mut events,
        "the nexthop made",
        |e| matches!(e, Event::Nexthop { nexthop, removed: false } if *nexthop == nh),
    )
    .await;
    ns.ip(&["nexthop", "del", "id", "77"]);
    seen(
        &mut events,
        "the nexthop deleted by hand",
        |e| matches!(e, Event::Nexthop { nexthop, removed: true } if *nexthop == nh),
    )
    .await;

    ns.ip(&["link", "del", "vx9"]);
    seen(
        &mut events,
        "the link deleted by hand",
        |e| matches!(e, Event::Link { link, removed: true } if link.name == "vx9"),
    )
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_listener_with_a_big_buffer_misses_nothing_of_a_burst() {
    const N: u32 = 5000;
    let ns = TestNs::new("kbb");
    let handle = Netns::open(ns.path()).unwrap();
    let conn = Conn::open_in(&handle).unwrap();
    let mut events = Events::subscribe_in_with_buffer(&handle, 64 << 20).unwrap();
    ns.ip(&[
        "link", "add", "under0", "type", "veth", "peer", "name", "under1",
    ]);
    ns.ip(&["addr", "add", "192.168.61.1/24", "dev", "under0"]);
    ns.ip(&["link", "set", "under0", "up"]);
    let dev = conn.link_by_name("under0").await.unwrap().unwrap().index;
    let routes: Vec<Route> = (0..N)
        .map(|i| {
            let dst = Ipv4Addr::from(0x0a90_0000 + (i << 8));
            let gw = "192.168.61.254".parse().ok();
            Route::new(
                ipnetwork::IpNetwork::new(dst.into(), 24).unwrap(),
                gw,
                Some(dev),
            )
        })
        .collect();
    // Written while nobody reads the listener: its buffer holds them all.
    let writes: Vec<Write> = routes.iter().map(Write::SetRoute).collect();
    assert!(conn.write(&writes).await.is_empty());
    let mut seen = 0;
    let counted = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(e) = events.next().await {
            match e {
                Event::Overflow => return Err("an overflow"),
                Event::Route {
                    route,
                    removed: false,
                } if route.oif == Some(dev) && route.dst.prefix() == 24 => {
                    seen += 1;
                    if seen == N {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
        Err("the end of the stream")
    })
    .await;
    assert_eq!(counted, Ok(Ok(())), "{seen} of {N} route notifications");
}

#[test]
fn blocking_calls_work_from_inside_an_async_runtime() {
    let ns = TestNs::new("kas");
    let (_h, nl) = open(&ns);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let lo = rt.block_on(async { nl.link_by_name("lo") }).unwrap();
    assert!(lo.is_some_and(|l| l.up));
    // Opened inside a task, and two at once, as the daemon may.
    let handle = Netns::open(ns.path()).unwrap();
    let (a, b) = rt.block_on(async {
        let a = Netlink::open_in(&handle).unwrap();
        let b = Netlink::open_in(&handle).unwrap();
        (a.link_by_name("lo").unwrap(), b.links().unwrap())
    });
    assert!(a.is_some() && b.iter().any(|l| l.name == "lo"));
    // Dropped inside a task too.
    rt.block_on(async move { drop(nl) });
}

#[test]
fn five_thousand_neighbours_fdb_entries_and_routes_are_programmed_and_listed() {
    const N: u32 = 5000;
    let ns = TestNs::new("k5k");
    let (_h, nl) = open(&ns);
    let dev = overlay(&ns, &nl);
    let peer = |i: u32| {
        let mac = [0x0e, 0x10, 0, (i >> 16) as u8, (i >> 8) as u8, i as u8];
        let subnet = Ipv4Addr::from(0x0a80_0000 + (i << 8));
        (mac, subnet)
    };
    let neighbours: Vec<Neighbour> = (0..N)
        .map(|i| {
            let (mac, subnet) = peer(i);
            Neighbour::permanent(dev, subnet.into(), mac)
        })
        .collect();
    let fdb: Vec<FdbEntry> = (0..N)
        .map(|i| {
            let (mac, _) = peer(i);
            let under = Ipv4Addr::from(0xc0a8_0000 + 0x100 + i);
            FdbEntry::permanent(dev, mac, under.into())
        })
        .collect();
    let routes: Vec<Route> = (0..N)
        .map(|i| {
            let (_, subnet) = peer(i);
            Route::new(
                ipnetwork::IpNetwork::new(subnet.into(), 24).unwrap(),
                Some(subnet.into()),
                Some(dev),
            )
            .onlink()
        })
        .collect();

    let start = Instant::now();
    assert!(nl
        .replace_neighbours(&neighbours)
        .unwrap()
        .iter()
        .all(|c| *c));
    let t_neigh = start.elapsed();
    assert!(nl.add_fdbs(&fdb).unwrap().iter().all(|c| *c));
    let t_fdb = start.elapsed() - t_neigh;
    assert!(nl.replace_routes(&routes).unwrap().iter().all(|c| *c));
    let t_routes = start.elapsed() - t_neigh - t_fdb;
    println!(
        "programmed {N} neighbours in {t_neigh:?}, {N} FDB entries in {t_fdb:?}, {N} routes in {t_routes:?}"
    );

    let start = Instant::now();
    // Besides ours, the device has the kernel's own (IPv6 multicast) entries.
    let listed_neigh: Vec<Neighbour> = nl
        .neighbours(dev)
        .unwrap()
        .into_iter()
        .filter(|n| n.permanent && n.ip.is_ipv4())
        .collect();
    let listed_fdb: Vec<FdbEntry> = nl
        .fdb(dev)
        .unwrap()
        .into_iter()
        .filter(|f| f.dst.is_some())
        .collect();
    let listed_routes: Vec<Route> = nl
        .routes()
        .unwrap()
        .into_iter()
        .filter(|r| r.oif == Some(dev) && r.onlink)
        .collect();
    println!("listed them in {:?}", start.elapsed());
    assert_eq!(listed_neigh.len(), N as usize);
    assert_eq!(listed_fdb.len(), N as usize);
    assert_eq!(listed_routes.len(), N as usize);
    assert!(neighbours.iter().all(|n| listed_neigh.contains(n)));
    assert!(fdb.iter().all(|f| listed_fdb.contains(f)));
    assert!(routes.iter().all(|r| listed_routes.contains(r)));
    // What iproute2 counts.
    let shown = ns.ip(&["route", "show", "dev", "flannel.1"]);
    assert_eq!(
        shown.lines().filter(|l| l.contains("onlink")).count(),
        N as usize
    );

    let start = Instant::now();
    assert!(nl
        .replace_neighbours(&neighbours)
        .unwrap()
        .iter()
        .all(|c| !*c));
    assert!(nl.add_fdbs(&fdb).unwrap().iter().all(|c| !*c));
    assert!(nl.replace_routes(&routes).unwrap().iter().all(|c| !*c));
    println!("found all {} already there in {:?}", 3 * N, start.elapsed());
    assert!(nl.delete_routes(&routes).unwrap().iter().all(|c| *c));
    assert!(nl
        .routes()
        .unwrap()
        .iter()
        .all(|r| r.oif != Some(dev) || !r.onlink));
}

/// The nexthop of a peer numbered `i` and the route to its /24 through it.
fn peer_via_nexthop(i: u32, dev: u32) -> (Nexthop, Route) {
    let subnet = Ipv4Addr::from(0x0a80_0000 + (i << 8));
    let id = 1_000_000 + i;
    (
        Nexthop::onlink(id, subnet.into(), dev),
        Route::via_nexthop(ipnetwork::IpNetwork::new(subnet.into(), 24).unwrap(), id),
    )
}

#[test]
fn thousands_of_nexthops_and_routes_through_them_are_programmed_listed_and_deleted() {
    const N: u32 = 20_000;
    let ns = TestNs::new("knk");
    let (handle, nl) = open(&ns);
    let dev = overlay(&ns, &nl);
    let (nexthops, routes): (Vec<Nexthop>, Vec<Route>) =
        (0..N).map(|i| peer_via_nexthop(i, dev)).unzip();
    let mut writes: Vec<Write> = nexthops.iter().map(Write::SetNexthop).collect();
    writes.extend(routes.iter().map(Write::SetRoute));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let conn = rt.block_on(async { Conn::open_in(&handle) }).unwrap();
    let start = Instant::now();
    let failed = rt.block_on(conn.write(&writes));
    let took = start.elapsed();
    assert!(failed.is_empty(), "{failed:?}");
    println!("wrote {N} nexthops and {N} routes through them in one batch in {took:?}");

    let start = Instant::now();
    let mut listed_nh = nl.nexthops().unwrap();
    let listed_routes: Vec<Route> = nl
        .routes()
        .unwrap()
        .into_iter()
        .filter(|r| r.nhid.is_some())
        .collect();
    println!("listed them in {:?}", start.elapsed());
    listed_nh.sort_by_key(|n| n.id);
    assert_eq!(listed_nh, nexthops);
    assert_eq!(listed_routes.len(), N as usize);
    let want: std::collections::HashSet<&Route> = routes.iter().collect();
    assert!(listed_routes.iter().all(|r| want.contains(r)));
    // What iproute2 counts.
    let shown = ns.ip(&["route", "show", "dev", "flannel.1"]);
    assert_eq!(
        shown.lines().filter(|l| l.contains(" nhid ")).count(),
        N as usize
    );
    let shown = ns.ip(&["nexthop", "show"]);
    assert_eq!(shown.lines().count(), N as usize);

    let start = Instant::now();
    let sample = &nexthops[..N as usize / 10];
    assert!(sample.iter().all(|nh| !nl.set_nexthop(nh).unwrap()));
    assert!(nl.replace_routes(&routes).unwrap().iter().all(|c| !*c));
    println!(
        "found {} nexthops and all {N} routes already there in {:?}",
        sample.len(),
        start.elapsed()
    );

    // Routes first, then their nexthops: each is one removal. A nexthop deleted with routes
    // through it takes them along, but the kernel then walks the whole IPv4 table for each.
    let half = N as usize / 2;
    let mut deletes: Vec<Write> = routes[..half].iter().map(Write::DeleteRoute).collect();
    deletes.extend(nexthops[..half].iter().map(|n| Write::DeleteNexthop(n.id)));
    let start = Instant::now();
    assert!(rt.block_on(conn.write(&deletes)).is_empty());
    println!(
        "deleted {half} routes, then their nexthops, in {:?}",
        start.elapsed()
    );
    let deletes: Vec<Write> = nexthops[half..]
        .iter()
        .map(|n| Write::DeleteNexthop(n.id))
        .collect();
    let start = Instant::now();
    assert!(rt.block_on(conn.write(&deletes)).is_empty());
    println!(
        "deleted {half} nexthops with the routes through them in {:?}",
        start.elapsed()
    );
    assert!(nl.nexthops().unwrap().is_empty());
    assert!(nl.routes().unwrap().iter().all(|r| r.nhid.is_none()));
    assert!(!ns.ip(&["route", "show"]).contains("nhid"));
    assert!(rt.block_on(conn.write(&deletes)).is_empty(), "already gone");
}

#[test]
fn a_batch_of_writes_is_made_and_names_only_what_the_kernel_refuses() {
    const N: u32 = 300;
    let ns = TestNs::new("kwb");
    let (handle, nl) = open(&ns);
    let dev = overlay(&ns, &nl);
    let mut routes = Vec::new();
    let mut neighbours = Vec::new();
    let mut fdb = Vec::new();
    for i in 0..N {
        let gw = IpAddr::from([10, 6, (i / 256) as u8, (i % 256) as u8]);
        let mac = [0x0e, 0, 0, 0, (i / 256) as u8, (i % 256) as u8];
        let dst = ipnetwork::IpNetwork::new(gw, 32).unwrap();
        routes.push(Route::new(dst, Some(gw), Some(dev)).onlink());
        neighbours.push(Neighbour::permanent(dev, gw, mac));
        fdb.push(FdbEntry::permanent(
            dev,
            mac,
            IpAddr::from([192, 168, 50, 100]),
        ));
    }
    // A route through a link that does not exist, and a neighbour that is not there to delete.
    let refused = Route::new(
        "10.9.9.0/24".parse().unwrap(),
        Some("10.9.9.1".parse().unwrap()),
        Some(9999),
    )
    .onlink();
    let absent = Neighbour::permanent(dev, "10.7.0.1".parse().unwrap(), [0x0e, 7, 0, 0, 0, 1]);
    // A route through a nexthop that comes later in the batch: too early.
    let (late_nh, early) = peer_via_nexthop(1, dev);
    let mut writes: Vec<Write> = vec![Write::DeleteNeighbour(&absent), Write::SetRoute(&early)];
    writes.extend(neighbours.iter().map(Write::SetNeighbour));
    writes.extend(fdb.iter().map(Write::SetFdb));
    writes.extend(routes.iter().map(Write::SetRoute));
    writes.push(Write::SetRoute(&refused));
    writes.push(Write::SetNexthop(&late_nh));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let conn = rt.block_on(async { Conn::open_in(&handle) }).unwrap();
    let failed = rt.block_on(conn.write(&writes));
    assert_eq!(
        failed.len(),
        2,
        "only the route through no nexthop yet and the one through no link: {failed:?}"
    );
    assert!(
        failed[0].to_string().contains("10.128.1.0/24 nhid 1000001"),
        "{}",
        failed[0]
    );
    assert!(
        failed[1].to_string().contains("10.9.9.0/24"),
        "{}",
        failed[1]
    );
    let count = |args: &[&str]| {
        ns.run(args[0], &args[1..])
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count()
    };
    let all = |n: usize| {
        assert_eq!(count(&["ip", "route", "show", "dev", "flannel.1"]), n);
        assert_eq!(count(&["ip", "neigh", "show", "dev", "flannel.1"]), n);
        assert_eq!(count(&["bridge", "fdb", "show", "dev", "flannel.1"]), n);
    };
    all(N as usize);
    assert!(ns
        .ip(&["nexthop", "show"])
        .contains("id 1000001 via 10.128.1.0 dev flannel.1"));
    // Written again: nothing to refuse; then all deleted, twice.
    let writes: Vec<Write> = writes[2..writes.len() - 2].to_vec();
    assert!(rt.block_on(conn.write(&writes)).is_empty());
    let mut deletes: Vec<Write> = routes.iter().map(Write::DeleteRoute).collect();
    deletes.extend(neighbours.iter().map(Write::DeleteNeighbour));
    deletes.extend(fdb.iter().map(Write::DeleteFdb));
    assert!(rt.block_on(conn.write(&deletes)).is_empty());
    all(0);
    assert!(rt.block_on(conn.write(&deletes)).is_empty(), "already gone");
}
