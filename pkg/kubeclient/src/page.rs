//! A list answer read as it arrives: each element of its `items` is parsed as soon as its last
//! byte is in, so that only one object's text is held at a time (a page of 500 real Nodes is
//! megabytes of status), and parsed from a slice, which is several times faster than parsing
//! from a reader. What is not an item (kind, metadata) is kept to be parsed at the end. The
//! fields of an item the caller's type never reads (a Node's status: images, conditions,
//! volumes, three quarters of a real Node) are cut out as they pass, so the parser never walks
//! them.

use serde::de::DeserializeOwned;
use serde::Deserialize;

/// The metadata of a list.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListMeta {
    #[serde(default)]
    pub(crate) resource_version: String,
    #[serde(rename = "continue", default)]
    pub(crate) continue_token: Option<String>,
}

#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    metadata: ListMeta,
}

/// Where the reader is in the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Before the items: the bytes go to `rest`.
    Head,
    /// Inside the items array.
    Items,
    /// After it: the bytes go to `rest` again.
    Tail,
}

/// The longest key remembered: long enough for `items`.
const KEY: usize = 8;
/// The longest key of an item remembered, for the fields to cut out.
const FIELD_KEY: usize = 32;

pub(crate) struct PageReader<T> {
    pub(crate) items: Vec<T>,
    /// The answer without the items' text.
    rest: Vec<u8>,
    /// The text of the item being read, from its earlier frames.
    item: Vec<u8>,
    part: Part,
    depth: usize,
    in_string: bool,
    /// A backslash ended the last frame inside a string.
    escaped: bool,
    /// The last string read at the answer's top level, its first `KEY` bytes: the key of the
    /// value that follows.
    key: Vec<u8>,
    /// The fields of each item to cut out unread: `status`, `metadata.managedFields`.
    unread: &'static [&'static str],
    /// The last string read at an item's top level (its first `FIELD_KEY` bytes)...
    field: Vec<u8>,
    /// ...the one whose object or array is open one level down...
    parent: Vec<u8>,
    /// ...and the last string read in it.
    inner: Vec<u8>,
    /// The depth a value being cut out opened at; 0 when none is.
    cutting: usize,
}

impl<T: DeserializeOwned> PageReader<T> {
    /// A reader that cuts the fields `unread` (paths of at most two keys, `metadata.labels`)
    /// out of each item, as `null`.
    pub(crate) fn new(unread: &'static [&'static str]) -> PageReader<T> {
        PageReader {
            items: Vec::new(),
            rest: Vec::new(),
            item: Vec::new(),
            part: Part::Head,
            depth: 0,
            in_string: false,
            escaped: false,
            key: Vec::new(),
            unread,
            field: Vec::new(),
            parent: Vec::new(),
            inner: Vec::new(),
            cutting: 0,
        }
    }

    /// Whether the value opening now at `depth` inside an item is one to cut out.
    fn unread_here(&self) -> bool {
        let (parent, key): (&[u8], &[u8]) = match self.depth {
            3 => (b"", &self.field),
            4 => (&self.parent, &self.inner),
            _ => return false,
        };
        self.unread.iter().any(|path| {
            let path = path.as_bytes();
            match path.iter().position(|&b| b == b'.') {
                Some(dot) => parent == &path[..dot] && key == &path[dot + 1..],
                None => parent.is_empty() && key == path,
            }
        })
    }

    /// The key buffer a string at the current depth goes to, if any.
    fn key_at_depth(&mut self) -> Option<(&mut Vec<u8>, usize)> {
        match (self.part, self.depth) {
            (Part::Items, _) if self.cutting != 0 || self.unread.is_empty() => None,
            (Part::Items, 3) => Some((&mut self.field, FIELD_KEY)),
            (Part::Items, 4) => Some((&mut self.inner, FIELD_KEY)),
            (Part::Items, _) => None,
            (_, 1) => Some((&mut self.key, KEY)),
            _ => None,
        }
    }

    /// The next frame of the answer; Err for text that is not a list.
    pub(crate) fn feed(&mut self, frame: &[u8]) -> Result<(), String> {
        // Where the text that goes to `rest` or to `item` began in this frame.
        let mut from = 0;
        let mut i = 0;
        while i < frame.len() {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                    i += 1;
                    continue;
                }
                match memchr::memchr2(b'"', b'\\', &frame[i..]) {
                    None => {
                        self.keep_key(&frame[i..]);
                        i = frame.len();
                    }
                    Some(k) => {
                        self.keep_key(&frame[i..i + k]);
                        i += k;
                        if frame[i] == b'\\' {
                            self.escaped = true;
                        } else {
                            self.in_string = false;
                        }
                        i += 1;
                    }
                }
                continue;
            }
            let b = frame[i];
            if self.part == Part::Items && self.depth == 2 {
                // Between two items.
                match b {
                    b'{' => {
                        self.depth = 3;
                        from = i;
                    }
                    b']' => {
                        self.depth = 1;
                        self.part = Part::Tail;
                        from = i;
                    }
                    b',' | b' ' | b'\n' | b'\r' | b'\t' => {}
                    _ => return Err("an item of the list is not an object".into()),
                }
                i += 1;
                continue;
            }
            match b {
                b'"' => {
                    self.in_string = true;
                    if let Some((key, _)) = self.key_at_depth() {
                        key.clear();
                    }
                }
                b'{' | b'[' => {
                    if self.part == Part::Items && self.cutting == 0 {
                        if self.depth == 3 {
                            self.parent.clone_from(&self.field);
                        }
                        if self.unread_here() {
                            // What came before goes to the item's text, the value as null.
                            self.item.extend_from_slice(&frame[from..i]);
                            self.item.extend_from_slice(b"null");
                            self.cutting = self.depth;
                        }
                    }
                    self.depth += 1;
                    if self.part == Part::Head
                        && self.depth == 2
                        && b == b'['
                        && self.key == b"items"
                    {
                        self.rest.extend_from_slice(&frame[from..=i]);
                        self.part = Part::Items;
                        from = i + 1;
                    }
                }
                b'}' | b']' => {
                    self.depth = self
                        .depth
                        .checked_sub(1)
                        .ok_or("a bracket closes what was never opened")?;
                    if self.cutting != 0 && self.depth == self.cutting {
                        self.cutting = 0;
                        from = i + 1;
                    } else if self.part == Part::Items && self.depth == 2 {
                        self.finish_item(&frame[from..=i])?;
                        from = i + 1;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        match self.part {
            Part::Items if self.depth > 2 && self.cutting == 0 => {
                self.item.extend_from_slice(&frame[from..])
            }
            Part::Items => {}
            Part::Head | Part::Tail => self.rest.extend_from_slice(&frame[from..]),
        }
        Ok(())
    }

    /// Keeps the start of a string that may be a key.
    fn keep_key(&mut self, text: &[u8]) {
        if let Some((key, max)) = self.key_at_depth() {
            let room = (max + 1).saturating_sub(key.len());
            key.extend_from_slice(&text[..text.len().min(room)]);
        }
    }

    /// An item's last bytes are in: parsed, its text let go.
    fn finish_item(&mut self, last: &[u8]) -> Result<(), String> {
        let parsed = if self.item.is_empty() {
            serde_json::from_slice(last)
        } else {
            self.item.extend_from_slice(last);
            let p = serde_json::from_slice(&self.item);
            self.item.clear();
            p
        };
        self.items.push(parsed.map_err(|e| e.to_string())?);
        Ok(())
    }

    /// The answer ended: its items and its metadata.
    pub(crate) fn finish(self) -> Result<(Vec<T>, ListMeta), String> {
        if self.depth != 0 || self.in_string || self.part == Part::Items {
            return Err("the answer ended in the middle".into());
        }
        let head: Head = serde_json::from_slice(&self.rest).map_err(|e| e.to_string())?;
        Ok((self.items, head.metadata))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// `text` fed in frames of `size` bytes.
    fn read(text: &[u8], size: usize) -> Result<(Vec<Value>, ListMeta), String> {
        let mut r = PageReader::<Value>::new(&[]);
        for frame in text.chunks(size) {
            r.feed(frame)?;
        }
        r.finish()
    }

    #[test]
    fn items_are_read_whatever_the_frames() {
        let items = vec![
            json!({"metadata": {"name": "a"}, "spec": {"x": "}{][\"\\"}}),
            json!({"metadata": {"name": "b", "annotations": {"items": "[{"}}}),
            json!({"metadata": {"name": "c"}, "status": {"list": [[1, 2], {"k": []}]}}),
        ];
        let page = json!({
            "kind": "NodeList", "apiVersion": "v1",
            "metadata": {"resourceVersion": "42", "continue": "tok"},
            "items": items,
        });
        let text = serde_json::to_vec(&page).unwrap();
        // Pretty-printed too: whitespace between the tokens.
        let pretty = serde_json::to_vec_pretty(&page).unwrap();
        for t in [&text, &pretty] {
            for size in [1, 2, 3, 7, 64, t.len()] {
                let (got, meta) = read(t, size).unwrap_or_else(|e| panic!("frames of {size}: {e}"));
                assert_eq!(got, items, "frames of {size}");
                assert_eq!(meta.resource_version, "42");
                assert_eq!(meta.continue_token.as_deref(), Some("tok"));
            }
        }
    }

    #[test]
    fn unread_fields_are_cut_out_as_null_whatever_the_frames() {
        let item = |name: &str, tricky: &str| {
            json!({
                "metadata": {"name": name, "managedFields": [{"f:status": {"}": tricky}}],
                             "labels": {"status": "[{"}},
                "status": {"images": [{"names": [tricky, "b"]}], "status": {"x": 1}},
                "spec": {"podCIDR": "10.0.0.0/24", "status": [1]},
                "kind": "status",
            })
        };
        let items = vec![item("a", "]}\"{["), item("b", "\\"), item("c", "")];
        let page = json!({"metadata": {"resourceVersion": "9"}, "items": items});
        let cut = |mut v: Value| {
            v["status"] = Value::Null;
            v["metadata"]["managedFields"] = Value::Null;
            v
        };
        let want: Vec<Value> = items.iter().cloned().map(cut).collect();
        for t in [
            serde_json::to_vec(&page).unwrap(),
            serde_json::to_vec_pretty(&page).unwrap(),
        ] {
            for size in [1, 2, 5, 13, 100, t.len()] {
                let mut r = PageReader::<Value>::new(&["status", "metadata.managedFields"]);
                for frame in t.chunks(size) {
                    r.feed(frame).unwrap();
                }
                let (got, meta) = r.finish().unwrap();
                assert_eq!(got, want, "frames of {size}");
                assert_eq!(meta.resource_version, "9");
            }
        }
        // Nothing to cut: the items as they are.
        assert_eq!(
            read(&serde_json::to_vec(&page).unwrap(), 7).unwrap().0,
            items
        );
    }

    #[test]
    fn the_metadata_may_follow_the_items_and_the_items_may_be_none() {
        let text = br#"{"items":[{"a":1}],"metadata":{"resourceVersion":"7"},"kind":"PodList"}"#;
        let (got, meta) = read(text, 5).unwrap();
        assert_eq!(got, [json!({"a": 1})]);
        assert_eq!(meta.resource_version, "7");
        for empty in [
            &br#"{"metadata":{"resourceVersion":"8"},"items":[]}"#[..],
            br#"{"metadata":{"resourceVersion":"8"},"items":null}"#,
            br#"{"metadata":{"resourceVersion":"8"}}"#,
        ] {
            let (got, meta) = read(empty, 4).unwrap();
            assert!(got.is_empty());
            assert_eq!(meta.resource_version, "8");
        }
    }

    #[test]
    fn what_is_not_a_list_is_refused() {
        assert!(read(br#"{"items":[{"a":1}"#, 3).is_err());
        assert!(read(br#"{"items":[1,2]}"#, 3).is_err());
        assert!(read(br#"{"items":[{"a":}]}"#, 3).is_err());
        assert!(read(br#"}"#, 3).is_err());
        assert!(read(br#"not json"#, 3).is_err());
    }
}
