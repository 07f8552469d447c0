//! Every class of bad input: the spec's code, a message naming the field or variable and its
//! value, exit status 1, and nothing on stdout but the error object. Nothing here needs a namespace:
//! validation happens before any kernel work.

use serde_json::{json, Value};
use testkit::Invocation;

fn good() -> Value {
    json!({"cniVersion": "1.0.0", "name": "lo-net", "type": "loopback"})
}

fn add() -> Invocation {
    Invocation::new("loopback", "ADD").netns("/run/netns/unused")
}

fn assert_names(e: &Value, needles: &[&str]) {
    let msg = e["msg"].as_str().unwrap();
    for n in needles {
        assert!(msg.contains(n), "message {msg:?} does not name {n:?}");
    }
}

#[test]
fn each_required_variable_missing() {
    for (cmd, vars) in [
        (
            "ADD",
            &[
                "CNI_COMMAND",
                "CNI_CONTAINERID",
                "CNI_NETNS",
                "CNI_IFNAME",
                "CNI_PATH",
            ][..],
        ),
        ("DEL", &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"][..]),
        (
            "CHECK",
            &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"][..],
        ),
    ] {
        for var in vars {
            let out = add().command(cmd).unset(var).run(&good());
            let e = out.err(4);
            assert_names(&e, &[var]);
        }
    }
}

#[test]
fn unknown_command() {
    let e = add().command("PING").run(&good()).err(4);
    assert_names(&e, &["CNI_COMMAND", "PING"]);
}

#[test]
fn bad_container_ids() {
    for id in ["../x", "a/b"] {
        let e = add().container_id(id).run(&good()).err(4);
        assert_names(&e, &["CNI_CONTAINERID", id]);
        // No ADD takes it, so nothing was made for it: DEL has nothing to undo.
        add().command("DEL").container_id(id).run(&good()).ok();
    }
    // An empty variable is a missing one.
    let e = add().container_id("").run(&good()).err(4);
    assert_names(&e, &["CNI_CONTAINERID"]);
    // Upper case is allowed, as the spec's pattern allows it, and so is any length, as in Go:
    // these get as far as the namespace.
    let long = "a".repeat(1000);
    for id in ["ABC-def_1.2", long.as_str()] {
        let e = add().container_id(id).run(&good()).err(3);
        assert_names(&e, &["/run/netns/unused"]);
    }
}

#[test]
fn bad_interface_names() {
    for ifname in ["abcdefghijklmnop", "a/b", "a b", ".."] {
        let e = add().ifname(ifname).run(&good()).err(4);
        assert_names(&e, &["CNI_IFNAME", ifname]);
    }
}

#[test]
fn bad_stdin() {
    let e = add().run_in(None, b"").err(6);
    assert_names(&e, &["empty"]);
    let e = add().run_in(None, b"{not json").err(6);
    assert_names(&e, &["decoding"]);
    let e = add().run_in(None, b"[1,2]").err(6);
    assert_names(&e, &["[1,2]"]);
    let e = add()
        .run(&json!({"cniVersion": "1.0.0", "name": 5, "type": "loopback"}))
        .err(6);
    assert_names(&e, &["\"name\"", "5"]);
    let e = add()
        .run(&json!({"cniVersion": 1.0, "name": "n", "type": "loopback"}))
        .err(6);
    assert_names(&e, &["\"cniVersion\"", "1.0"]);
    let e = add()
        .run(&json!({"cniVersion": "1.0.0", "name": "n", "type": "loopback", "prevResult": "x"}))
        .err(6);
    assert_names(&e, &["prevResult", "\"x\""]);
    let e = add()
        .run(&json!({"cniVersion": "1.0.0", "type": "loopback"}))
        .err(7);
    assert_names(&e, &["name"]);
    let e = add()
        .run(&json!({"cniVersion": "1.0.0", "name": "bad/name", "type": "loopback"}))
        .err(7);
    assert_names(&e, &["bad/name"]);
}

#[test]
fn version_gates() {
    let mut c = good();
    c["cniVersion"] = json!("9.9.9");
    let e = add().run(&c).err(1);
    assert_names(&e, &["9.9.9"]);
    assert_eq!(
        e["cniVersion"], "1.1.0",
        "an unknown version is answered in the newest"
    );

    c["cniVersion"] = json!("0.3.1");
    let e = add().command("CHECK").run(&c).err(1);
    assert_names(&e, &["0.3.1", "CHECK"]);
    assert_eq!(e["cniVersion"], "0.3.1");

    c["cniVersion"] = json!("1.0.0");
    let e = add().command("GC").run(&c).err(1);
    assert_names(&e, &["1.0.0", "GC"]);
    let e = add().command("STATUS").run(&c).err(1);
    assert_names(&e, &["1.0.0", "STATUS"]);
}

#[test]
fn version_answers_whatever_stdin_holds() {
    for stdin in [&b""[..], b"garbage", b"{\"cniVersion\":\"0.3.1\"}"] {
        let v = Invocation::new("loopback", "VERSION")
            .unset("CNI_PATH")
            .run_in(None, stdin)
            .ok();
        assert_eq!(v["supportedVersions"].as_array().unwrap().len(), 7);
        assert!(v["cniVersion"].is_string());
    }
}
