//! A read-only JSON tree that borrows from the text it was parsed from.
//!
//! Inside a plugin most of a call's instructions used to go into building a
//! `serde_json::Value` of the facts: an allocation per string, a B-tree per object. Here one
//! pass over the text writes a flat tape of tokens (kind, byte span, index of the next
//! sibling); a [`Json`] is an index into it, so reading a value allocates nothing, skipping a
//! subtree is one step, and strings are slices of the original text. Strings with escape
//! sequences, the rare case in facts, are decoded once during the pass.

use std::fmt;

mod parse;

/// Where and why a text is not JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub at: usize,
    pub what: &'static str,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}", self.what, self.at)
    }
}

/// Nesting deeper than this is refused, as `serde_json` refuses it.
pub const MAX_DEPTH: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Null,
    True,
    False,
    Number,
    /// `start..end` is the text between the quotes.
    Str,
    /// As `Str`, with escapes: the decoded text is in `Tape::decoded`.
    EscapedStr,
    Array,
    Object,
}

/// One value (or object key). Containers span their brackets; `next` is the index of the
/// token after the value's last descendant, `len` the number of elements or members. Object
/// members are a key token then a value.
#[derive(Debug, Clone, Copy)]
struct Token {
    kind: Kind,
    start: u32,
    end: u32,
    next: u32,
    len: u32,
}

/// The parsed form of one JSON text; see [`Json`] for reading it.
#[derive(Debug, Clone, Default)]
pub struct Tape {
    tokens: Vec<Token>,
    /// (token index, decoded text) of the strings with escapes, in token order.
    decoded: Vec<(u32, String)>,
}

impl Tape {
    /// Parses `src`, which must be exactly one JSON value with optional surrounding whitespace.
    pub fn parse(src: &str) -> Result<Self, ParseError> {
        parse::Parser::new(src).run()
    }

    /// The top-level value of `src`, which must be the text this tape was parsed from.
    pub fn root<'a>(&'a self, src: &'a str) -> Json<'a> {
        Json {
            src,
            tape: self,
            at: 0,
        }
    }
}

/// A value in a parsed JSON text: a cheap, copyable handle. Its accessors mirror
/// `serde_json::Value`'s (`get`, `as_str`, `as_array`, ...) but borrow instead of owning.
#[derive(Clone, Copy)]
pub struct Json<'a> {
    src: &'a str,
    tape: &'a Tape,
    at: u32,
}

impl<'a> Json<'a> {
    fn token(&self) -> Token {
        self.tape.tokens[self.at as usize]
    }

    fn at(&self, at: u32) -> Self {
        Json { at, ..*self }
    }

    pub fn is_null(&self) -> bool {
        self.token().kind == Kind::Null
    }

    pub fn is_array(&self) -> bool {
        self.token().kind == Kind::Array
    }

    pub fn is_object(&self) -> bool {
        self.token().kind == Kind::Object
    }

    pub fn is_string(&self) -> bool {
        matches!(self.token().kind, Kind::Str | Kind::EscapedStr)
    }

    pub fn is_number(&self) -> bool {
        self.token().kind == Kind::Number
    }

    /// The JSON text of this value (for a string: with its quotes and escapes).
    pub fn raw(&self) -> &'a str {
        let t = self.token();
        match t.kind {
            // Strings record their contents; widen to the quotes.
            Kind::Str | Kind::EscapedStr => &self.src[t.start as usize - 1..t.end as usize + 1],
            _ => &self.src[t.start as usize..t.end as usize],
        }
    }

    pub fn as_str(self) -> Option<&'a str> {
        let t = self.token();
        match t.kind {
            Kind::Str => Some(&self.src[t.start as usize..t.end as usize]),
            Kind::EscapedStr => {
                let decoded = &self.tape.decoded;
                decoded
                    .binary_search_by_key(&self.at, |(at, _)| *at)
                    .ok()
                    .map(|i| decoded[i].1.as_str())
            }
            _ => None,
        }
    }

    pub fn as_bool(self) -> Option<bool> {
        match self.token().kind {
            Kind::True => Some(true),
            Kind::False => Some(false),
            _ => None,
        }
    }

    fn number_text(&self) -> Option<&'a str> {
        let t = self.token();
        (t.kind == Kind::Number).then(|| &self.src[t.start as usize..t.end as usize])
    }

    /// A number written as a non-negative integer (like `serde_json`, `1.0` is not one).
    pub fn as_u64(self) -> Option<u64> {
        self.number_text()?.parse().ok()
    }

    pub fn as_i64(self) -> Option<i64> {
        self.number_text()?.parse().ok()
    }

    pub fn as_f64(self) -> Option<f64> {
        self.number_text()?.parse().ok()
    }

    /// The elements of an array.
    pub fn as_array(self) -> Option<Items<'a>> {
        let t = self.token();
        (t.kind == Kind::Array).then(|| Items {
            json: self,
            next: self.at + 1,
            left: t.len,
        })
    }

    /// The members of an object, in document order.
    pub fn as_object(self) -> Option<Members<'a>> {
        let t = self.token();
        (t.kind == Kind::Object).then(|| Members {
            json: self,
            next: self.at + 1,
            left: t.len,
        })
    }

    /// The names of an object's members (nothing for other values).
    pub fn keys(self) -> impl Iterator<Item = &'a str> {
        self.as_object().into_iter().flatten().map(|(k, _)| k)
    }

    /// Number of elements or members; 0 for scalars.
    pub fn len(self) -> usize {
        self.token().len as usize
    }

    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// An object's member or an array's element. When a member name repeats (which no
    /// facts document does: the host serialises them from a map), the first one is found.
    pub fn get(self, index: impl Index) -> Option<Json<'a>> {
        index.index_into(self)
    }

    /// RFC 6901 pointer lookup relative to this value (`/gpus/0/name`; `""` is the value itself).
    pub fn pointer(self, pointer: &str) -> Option<Json<'a>> {
        if pointer.is_empty() {
            return Some(self);
        }
        let path = pointer.strip_prefix('/')?;
        let mut here = self;
        for token in path.split('/') {
            here = if token.contains('~') {
                let token = token.replace("~1", "/").replace("~0", "~");
                here.step(&token)?
            } else {
                here.step(token)?
            };
        }
        Some(here)
    }

    /// One pointer step: a member name, or an array index in canonical decimal form.
    fn step(self, token: &str) -> Option<Json<'a>> {
        match self.token().kind {
            Kind::Object => self.get(token),
            Kind::Array if token == "0" || !token.starts_with('0') => {
                self.get(token.parse::<usize>().ok()?)
            }
            _ => None,
        }
    }

    /// A `serde_json::Value` copy, for code that wants one.
    pub fn to_value(self) -> serde_json::Value {
        use serde_json::Value;
        match self.token().kind {
            Kind::Null => Value::Null,
            Kind::True => Value::Bool(true),
            Kind::False => Value::Bool(false),
            Kind::Number => serde_json::from_str(self.raw()).unwrap_or(Value::Null),
            Kind::Str | Kind::EscapedStr => {
                Value::String(self.as_str().unwrap_or_default().to_string())
            }
            Kind::Array => Value::Array(
                self.as_array()
                    .into_iter()
                    .flatten()
                    .map(Json::to_value)
                    .collect(),
            ),
            Kind::Object => Value::Object(
                self.as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.to_string(), v.to_value()))
                    .collect(),
            ),
        }
    }
}

impl fmt::Debug for Json<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_value())
    }
}

/// Renders canonical JSON (`serde_json`'s formatting of the same value).
impl fmt::Display for Json<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_value())
    }
}

/// Equal when they hold the same JSON value, wherever they come from.
impl PartialEq for Json<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.to_value() == other.to_value()
    }
}

impl PartialEq<serde_json::Value> for Json<'_> {
    fn eq(&self, other: &serde_json::Value) -> bool {
        &self.to_value() == other
    }
}

/// What [`Json::get`] accepts: a member name or an array position.
pub trait Index {
    fn index_into<'a>(&self, json: Json<'a>) -> Option<Json<'a>>;
}

impl Index for str {
    fn index_into<'a>(&self, json: Json<'a>) -> Option<Json<'a>> {
        let t = json.token();
        if t.kind != Kind::Object {
            return None;
        }
        let (want, src) = (self.as_bytes(), json.src.as_bytes());
        let mut at = json.at + 1;
        for _ in 0..t.len {
            let key = json.tape.tokens[at as usize];
            let hit = match key.kind {
                Kind::Str => src.get(key.start as usize..key.end as usize) == Some(want),
                _ => json.at(at).as_str() == Some(self),
            };
            let value = json.at(at + 1);
            if hit {
                return Some(value);
            }
            at = value.token().next;
        }
        None
    }
}

impl Index for String {
    fn index_into<'a>(&self, json: Json<'a>) -> Option<Json<'a>> {
        self.as_str().index_into(json)
    }
}

impl Index for usize {
    fn index_into<'a>(&self, json: Json<'a>) -> Option<Json<'a>> {
        json.as_array()?.nth(*self)
    }
}

impl<T: Index + ?Sized> Index for &T {
    fn index_into<'a>(&self, json: Json<'a>) -> Option<Json<'a>> {
        (**self).index_into(json)
    }
}

/// The elements of an array; see [`Json::as_array`].
#[derive(Clone)]
pub struct Items<'a> {
    json: Json<'a>,
    next: u32,
    left: u32,
}

impl<'a> Iterator for Items<'a> {
    type Item = Json<'a>;

    fn next(&mut self) -> Option<Json<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let item = self.json.at(self.next);
        self.next = item.token().next;
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl ExactSizeIterator for Items<'_> {}

/// The (name, value) members of an object; see [`Json::as_object`].
#[derive(Clone)]
pub struct Members<'a> {
    json: Json<'a>,
    next: u32,
    left: u32,
}

impl<'a> Iterator for Members<'a> {
    type Item = (&'a str, Json<'a>);

    fn next(&mut self) -> Option<(&'a str, Json<'a>)> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let key = self.json.at(self.next);
        let value = self.json.at(self.next + 1);
        self.next = value.token().next;
        Some((key.as_str().unwrap_or_default(), value))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl ExactSizeIterator for Members<'_> {}

#[cfg(test)]
mod tests;
