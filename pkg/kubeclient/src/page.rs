//! A list answer read as it arrives: each element of its `items` is parsed as soon as its last
//! byte is in, so that only one object's text is held at a time (a page of 500 real Nodes is
//! megabytes of status), and parsed from a slice, which is several times faster than parsing
//! from a reader. What is not an item (kind, metadata) is kept to be parsed at the end.

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
}

impl<T: DeserializeOwned> PageReader<T> {
    pub(crate) fn new() -> PageReader<T> {
        PageReader {
            items: Vec::new(),
            rest: Vec::new(),
            item: Vec::new(),
            part: Part::Head,
            depth: 0,
            in_string: false,
            escaped: false,
            key: Vec::new(),
        }
    }

    /// The next frame of the answer; Err for text that is not a list.
    pub(crate) fn feed(&mut self, frame: &[u8]) -> Result<(), String> {
        // Where the text that goes to `rest` or to `item` began in this frame.
        let mut from = 0;
        let mut i = 0;
        while i < frame.len() {
            if self.in_string {
                let top = self.depth == 1 && self.part != Part::Items;
                if self.escaped {
                    self.escaped = false;
                    i += 1;
                    continue;
                }
                match memchr::memchr2(b'"', b'\\', &frame[i..]) {
                    None => {
                        if top {
                            self.keep_key(&frame[i..]);
                        }
                        i = frame.len();
                    }
                    Some(k) => {
                        if top {
                            self.keep_key(&frame[i..i + k]);
                        }
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
                    if self.depth == 1 {
                        self.key.clear();
                    }
                }
                b'{' | b'[' => {
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
                    if self.part == Part::Items && self.depth == 2 {
                        self.finish_item(&frame[from..=i])?;
                        from = i + 1;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        match self.part {
            Part::Items if self.depth > 2 => self.item.extend_from_slice(&frame[from..]),
            Part::Items => {}
            Part::Head | Part::Tail => self.rest.extend_from_slice(&frame[from..]),
        }
        Ok(())
    }

    fn keep_key(&mut self, text: &[u8]) {
        let room = (KEY + 1).saturating_sub(self.key.len());
        self.key.extend_from_slice(&text[..text.len().min(room)]);
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
        let mut r = PageReader::<Value>::new();
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
