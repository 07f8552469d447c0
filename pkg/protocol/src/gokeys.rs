//! Object keys matched to field names as Go's encoding/json matches them: the exact name
//! first, then a case-insensitive match; keys that match no field are ignored.
//!
//! Runtimes written in Go send some config with Go's field names rather than the CNI ones
//! (containerd, through go-cni, sends `{"HostPort": 8083, "ContainerPort": 80}`), and the Go
//! plugins read it. [`GoKeys`] gives every `Deserialize` struct this matching from the field
//! list serde already passes to `deserialize_struct`, so no struct needs per-field aliases;
//! [`get`] and [`canonicalise`] do the same for configs kept as raw JSON maps.
//!
//! When both an exact key and a case variant of it are present, the exact one is used and
//! the variant ignored. (Go keeps the later of the two in document order; a decoded
//! `serde_json::Map` no longer has that order, and runtimes never send both.)

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Go's case folding, for comparing with ASCII field names: ASCII letters, plus the two
/// other runes Unicode folds onto ASCII ones (long s onto s, the Kelvin sign onto k).
fn fold(c: char) -> char {
    match c {
        '\u{17F}' => 's',
        '\u{212A}' => 'k',
        c => c.to_ascii_lowercase(),
    }
}

/// Whether Go's decoder would take `key` for the field named `field`.
pub fn fold_eq(key: &str, field: &str) -> bool {
    key.chars().map(fold).eq(field.chars().map(fold))
}

/// The entries of `object` with the keys that set a field renamed to that field's name. A key
/// equal to no field, in any case, is kept as it is; a case variant of a key that is also
/// present exactly, or of one already taken, is dropped.
fn canonical_entries<'a>(
    object: &'a Map<String, Value>,
    fields: &[&'static str],
) -> Vec<(&'a str, &'a Value)> {
    let mut out: Vec<(&'a str, &'a Value)> = Vec::with_capacity(object.len());
    for (key, value) in object {
        if fields.contains(&key.as_str()) {
            out.push((key, value));
            continue;
        }
        match fields.iter().find(|f| fold_eq(key, f)) {
            Some(field) if object.contains_key(*field) => {}
            Some(field) if out.iter().any(|(k, _)| k == field) => {}
            Some(field) => out.push((field, value)),
            None => out.push((key, value)),
        }
    }
    out
}

/// The value of `field` in `object`: its exact key, else a case variant of it.
pub fn get<'a>(object: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    object.get(field).or_else(|| {
        object
            .iter()
            .find(|(k, _)| fold_eq(k, field))
            .map(|(_, v)| v)
    })
}

/// Renames the keys of `object` that name one of `fields` in another case to the field's
/// name, dropping the variants of a field that is present exactly. Other keys are kept.
pub fn canonicalise(object: &mut Map<String, Value>, fields: &[&'static str]) {
    let renamed: Map<String, Value> = canonical_entries(object, fields)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    *object = renamed;
}

/// A deserializer over a JSON value that matches struct fields as Go does, at every depth.
pub struct GoKeys<'a>(pub &'a Value);

type Error = serde_json::Error;

struct Entries<'a> {
    entries: std::vec::IntoIter<(&'a str, &'a Value)>,
    value: Option<&'a Value>,
}

impl<'a> Entries<'a> {
    fn new(entries: Vec<(&'a str, &'a Value)>) -> Self {
        Entries {
            entries: entries.into_iter(),
            value: None,
        }
    }
}

impl<'de> MapAccess<'de> for Entries<'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.entries.next() {
            None => Ok(None),
            Some((key, value)) => {
                self.value = Some(value);
                seed.deserialize(BorrowedStrDeserializer::new(key))
                    .map(Some)
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        // serde asks for a value only after a key; Null is the harmless answer otherwise.
        seed.deserialize(GoKeys(self.value.take().unwrap_or(&Value::Null)))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

struct Items<'a>(std::slice::Iter<'a, Value>);

impl<'de> SeqAccess<'de> for Items<'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.0
            .next()
            .map(|v| seed.deserialize(GoKeys(v)))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

/// Scalars are the plain value's business.
macro_rules! scalars {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            self.0.$method(visitor)
        }
    )*};
}

impl<'de> Deserializer<'de> for GoKeys<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Object(m) => visitor.visit_map(Entries::new(
                m.iter().map(|(k, v)| (k.as_str(), v)).collect(),
            )),
            Value::Array(a) => visitor.visit_seq(Items(a.iter())),
            other => other.deserialize_any(visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::Object(m) => visitor.visit_map(Entries::new(canonical_entries(m, fields))),
            other => other.deserialize_struct(name, fields, visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Array(a) => visitor.visit_seq(Items(a.iter())),
            other => other.deserialize_seq(visitor),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Array(a) => visitor.visit_seq(Items(a.iter())),
            other => other.deserialize_tuple(len, visitor),
        }
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::Array(a) => visitor.visit_seq(Items(a.iter())),
            other => other.deserialize_tuple_struct(name, len, visitor),
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Object(m) => visitor.visit_map(Entries::new(
                m.iter().map(|(k, v)| (k.as_str(), v)).collect(),
            )),
            other => other.deserialize_map(visitor),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.0.deserialize_enum(name, variants, visitor)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.0.deserialize_unit_struct(name, visitor)
    }

    scalars! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char deserialize_str
        deserialize_string deserialize_bytes deserialize_byte_buf deserialize_unit
        deserialize_identifier deserialize_ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(rename_all = "camelCase")]
    struct Mapping {
        host_port: Option<i64>,
        container_port: Option<i64>,
        protocol: Option<String>,
        #[serde(rename = "hostIP")]
        host_ip: Option<String>,
    }

    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(rename_all = "camelCase")]
    struct Outer {
        name: Option<String>,
        runtime_config: Option<Runtime>,
        raw: Option<Map<String, Value>>,
        pair: Option<(u8, Mapping)>,
    }

    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(rename_all = "camelCase")]
    struct Runtime {
        port_mappings: Option<Vec<Mapping>>,
    }

    fn decode<T: for<'de> Deserialize<'de>>(v: &Value) -> T {
        T::deserialize(GoKeys(v)).unwrap()
    }

    fn sample() -> Mapping {
        Mapping {
            host_port: Some(8083),
            container_port: Some(80),
            protocol: Some("tcp".into()),
            host_ip: Some(String::new()),
        }
    }

    #[test]
    fn go_names_lower_case_and_mixed_case_keys_all_match() {
        for m in [
            json!({"HostPort": 8083, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}),
            json!({"hostport": 8083, "containerport": 80, "protocol": "tcp", "hostip": ""}),
            json!({"HOSTPORT": 8083, "cOnTaInErPoRt": 80, "PROTOCOL": "tcp", "hostIp": ""}),
            json!({"hostPort": 8083, "containerPort": 80, "protocol": "tcp", "hostIP": ""}),
        ] {
            assert_eq!(decode::<Mapping>(&m), sample(), "{m}");
        }
    }

    #[test]
    fn matching_reaches_every_depth() {
        let v = json!({"Name": "n", "RuntimeConfig": {"PortMappings": [
            {"HostPort": 8083, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}]},
            "PAIR": [1, {"HostPort": 8083, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}]});
        let o: Outer = decode(&v);
        assert_eq!(o.name.as_deref(), Some("n"));
        assert_eq!(
            o.runtime_config.unwrap().port_mappings.unwrap(),
            vec![sample()]
        );
        assert_eq!(o.pair, Some((1, sample())));
    }

    #[test]
    fn the_exact_key_wins_over_a_case_variant() {
        for v in [
            json!({"hostPort": 1, "HostPort": 2}),
            json!({"HostPort": 2, "hostPort": 1}),
            json!({"HOSTPORT": 2, "hostPort": 1, "hostport": 3}),
        ] {
            assert_eq!(decode::<Mapping>(&v).host_port, Some(1), "{v}");
        }
    }

    #[test]
    fn two_case_variants_without_the_exact_key_set_the_field_once() {
        let m: Mapping = decode(&json!({"HOSTPORT": 2, "HostPort": 2}));
        assert_eq!(m.host_port, Some(2));
    }

    #[test]
    fn unknown_keys_are_ignored_and_maps_keep_their_keys() {
        let v = json!({"name": "n", "Unknown": 1, "hostPorts": 3,
                       "raw": {"HostPort": 1, "x": {"Y": 2}}});
        let o: Outer = decode(&v);
        assert_eq!(o.name.as_deref(), Some("n"));
        assert_eq!(
            Value::Object(o.raw.unwrap()),
            json!({"HostPort": 1, "x": {"Y": 2}})
        );
    }

    #[test]
    fn folding_is_gos() {
        assert!(fold_eq("HOSTIP", "hostIP"));
        // Unicode folds long s onto s and the Kelvin sign onto k; Go matches them too.
        assert!(fold_eq("\u{17F}nat", "snat"));
        assert!(fold_eq("\u{212A}ey", "key"));
        // Dotless i does not fold onto i, nor ß onto ss.
        assert!(!fold_eq("\u{131}p", "ip"));
        assert!(!fold_eq("ma\u{DF}", "mass"));
        assert!(!fold_eq("host_port", "hostPort"));
    }

    #[test]
    fn wrong_types_still_fail_with_the_plain_message() {
        let e = Mapping::deserialize(GoKeys(&json!({"HostPort": "x"}))).unwrap_err();
        assert!(e.to_string().contains("invalid type: string \"x\""), "{e}");
        assert!(Mapping::deserialize(GoKeys(&json!([1]))).is_err());
    }

    #[test]
    fn get_and_canonicalise_match_raw_maps() {
        let mut m = json!({"Type": "bridge", "IPMasq": true, "ipmasq": false, "Other": 1})
            .as_object()
            .cloned()
            .unwrap();
        assert_eq!(get(&m, "type"), Some(&json!("bridge")));
        assert_eq!(get(&m, "mtu"), None);
        canonicalise(&mut m, &["type", "ipMasq", "mtu"]);
        assert_eq!(m.get("type"), Some(&json!("bridge")));
        assert_eq!(m.get("Other"), Some(&json!(1)));
        assert!(m.get("ipMasq").is_some());
        assert_eq!(m.len(), 3, "{m:?}");
        let mut exact = json!({"IPMasq": true, "ipMasq": false})
            .as_object()
            .cloned()
            .unwrap();
        canonicalise(&mut exact, &["ipMasq"]);
        assert_eq!(Value::Object(exact), json!({"ipMasq": false}));
    }
}
