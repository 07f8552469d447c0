//! Running a conflist as libcni does: each plugin gets the list's `name` and `cniVersion`,
//! the runtime's capability arguments it asked for in `runtimeConfig`, and the previous
//! plugin's result as `prevResult`; DEL runs the list in reverse.

use crate::{Invocation, PluginOutput, TestNs};
use serde_json::{Map, Value};
use std::path::Path;

/// The config one plugin of the list receives.
pub fn plugin_config(
    list: &Value,
    plugin: &Value,
    runtime: &Map<String, Value>,
    prev: Option<&Value>,
) -> Value {
    let mut conf = plugin.clone();
    let o = conf.as_object_mut().expect("a plugin config is an object");
    o.insert("name".into(), list["name"].clone());
    o.insert("cniVersion".into(), list["cniVersion"].clone());
    let caps = plugin.get("capabilities").and_then(Value::as_object);
    let wanted: Map<String, Value> = runtime
        .iter()
        .filter(|(k, _)| {
            caps.and_then(|c| c.get(*k))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !wanted.is_empty() {
        o.insert("runtimeConfig".into(), Value::Object(wanted));
    }
    if let Some(p) = prev {
        o.insert("prevResult".into(), p.clone());
    }
    conf
}

/// ADD through every plugin of the list; the last result, or the first failure.
pub fn add(
    list: &Value,
    base: &Invocation,
    host: Option<&TestNs>,
    runtime: &Map<String, Value>,
) -> Result<Value, PluginOutput> {
    let mut prev: Option<Value> = None;
    for plugin in list["plugins"].as_array().into_iter().flatten() {
        let out = invoke(
            base,
            "ADD",
            plugin,
            host,
            &plugin_config(list, plugin, runtime, prev.as_ref()),
        );
        if out.code != 0 {
            return Err(out);
        }
        prev = Some(out.json());
    }
    prev.ok_or_else(|| PluginOutput {
        stdout: String::new(),
        stderr: "the conflist has no plugins".into(),
        code: 1,
    })
}

/// DEL (or CHECK with `command`) through the list; DEL runs in reverse order.
pub fn del(
    list: &Value,
    base: &Invocation,
    host: Option<&TestNs>,
    runtime: &Map<String, Value>,
    prev: Option<&Value>,
) -> Result<(), PluginOutput> {
    let plugins: Vec<&Value> = list["plugins"].as_array().into_iter().flatten().collect();
    for plugin in plugins.into_iter().rev() {
        let out = invoke(
            base,
            "DEL",
            plugin,
            host,
            &plugin_config(list, plugin, runtime, prev),
        );
        if out.code != 0 {
            return Err(out);
        }
    }
    Ok(())
}

fn invoke(
    base: &Invocation,
    command: &str,
    plugin: &Value,
    host: Option<&TestNs>,
    conf: &Value,
) -> PluginOutput {
    let ty = plugin["type"].as_str().unwrap_or_default();
    let dir = base
        .path
        .split(':')
        .find(|d| Path::new(d).join(ty).exists())
        .unwrap_or_default();
    let mut inv = base.clone().command(command);
    inv.plugin = Path::new(dir).join(ty);
    inv.run_in(host, conf.to_string().as_bytes())
}
