//! The one pass from JSON text to a [`Tape`]: tokens with their spans and sibling links,
//! escaped strings decoded once.

use super::{Kind, MAX_DEPTH, ParseError, Tape, Token};

pub(super) struct Parser<'s> {
    b: &'s [u8],
    src: &'s str,
    i: usize,
    tape: Tape,
    /// (index, values so far) of the containers still open.
    open: Vec<(u32, u32)>,
}

impl<'s> Parser<'s> {
    pub(super) fn new(src: &'s str) -> Self {
        Parser {
            b: src.as_bytes(),
            src,
            i: 0,
            tape: Tape::default(),
            open: Vec::new(),
        }
    }

    fn err<T>(&self, what: &'static str) -> Result<T, ParseError> {
        Err(ParseError { at: self.i, what })
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    fn push(&mut self, kind: Kind, start: usize, end: usize) {
        let next = self.tape.tokens.len() as u32 + 1;
        self.tape.tokens.push(Token {
            kind,
            start: start as u32,
            end: end as u32,
            next,
            len: 0,
        });
    }

    pub(super) fn run(mut self) -> Result<Tape, ParseError> {
        if self.b.len() >= u32::MAX as usize {
            return self.err("document too large");
        }
        // Facts average a token per 5-6 bytes; one reservation avoids regrowing the tape.
        self.tape.tokens.reserve(self.b.len() / 4);
        self.ws();
        'value: loop {
            // At the first byte of a value.
            if let Some((_, values)) = self.open.last_mut() {
                *values += 1;
            }
            match self.b.get(self.i) {
                Some(b'{' | b'[') => {
                    let object = self.b[self.i] == b'{';
                    if self.open.len() == MAX_DEPTH {
                        return self.err("nested more than 128 levels deep");
                    }
                    self.open.push((self.tape.tokens.len() as u32, 0));
                    self.push(
                        if object { Kind::Object } else { Kind::Array },
                        self.i,
                        self.i,
                    );
                    self.i += 1;
                    self.ws();
                    match (object, self.b.get(self.i)) {
                        (true, Some(b'}')) | (false, Some(b']')) => {}
                        (true, _) => {
                            self.key()?;
                            continue 'value;
                        }
                        (false, _) => continue 'value,
                    }
                    // An empty container: closed below.
                }
                Some(b'"') => self.string()?,
                Some(b't') => self.literal("true", Kind::True)?,
                Some(b'f') => self.literal("false", Kind::False)?,
                Some(b'n') => self.literal("null", Kind::Null)?,
                Some(b'-' | b'0'..=b'9') => self.number()?,
                Some(_) => return self.err("expected a value"),
                None => return self.err("unexpected end of input, expected a value"),
            }
            // After a value: close containers or move to the next member.
            loop {
                let Some(&(top, values)) = self.open.last() else {
                    break 'value;
                };
                self.ws();
                let object = self.tape.tokens[top as usize].kind == Kind::Object;
                match (object, self.b.get(self.i)) {
                    (_, Some(b',')) => {
                        self.i += 1;
                        self.ws();
                        if object {
                            self.key()?;
                        }
                        continue 'value;
                    }
                    (true, Some(b'}')) | (false, Some(b']')) => {
                        self.i += 1;
                        let next = self.tape.tokens.len() as u32;
                        let t = &mut self.tape.tokens[top as usize];
                        t.end = self.i as u32;
                        t.next = next;
                        t.len = values;
                        self.open.pop();
                    }
                    (true, _) => return self.err("expected `,` or `}`"),
                    (false, _) => return self.err("expected `,` or `]`"),
                }
            }
        }
        self.ws();
        if self.i != self.b.len() {
            return self.err("trailing characters");
        }
        Ok(self.tape)
    }

    /// A member name and its colon.
    fn key(&mut self) -> Result<(), ParseError> {
        if self.b.get(self.i) != Some(&b'"') {
            return self.err("expected a member name");
        }
        self.string()?;
        self.ws();
        if self.b.get(self.i) != Some(&b':') {
            return self.err("expected `:`");
        }
        self.i += 1;
        self.ws();
        Ok(())
    }

    fn literal(&mut self, word: &'static str, kind: Kind) -> Result<(), ParseError> {
        if !self.b[self.i..].starts_with(word.as_bytes()) {
            return self.err("expected a value");
        }
        self.push(kind, self.i, self.i + word.len());
        self.i += word.len();
        Ok(())
    }

    /// RFC 8259 number grammar; the value is converted only when someone asks for it.
    fn number(&mut self) -> Result<(), ParseError> {
        let start = self.i;
        let digits = |p: &mut Self| {
            let from = p.i;
            while p.b.get(p.i).is_some_and(u8::is_ascii_digit) {
                p.i += 1;
            }
            p.i - from
        };
        if self.b[self.i] == b'-' {
            self.i += 1;
        }
        match self.b.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => return self.err("invalid number"),
        }
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            if digits(self) == 0 {
                return self.err("invalid number");
            }
        }
        if let Some(b'e' | b'E') = self.b.get(self.i) {
            self.i += 1;
            if let Some(b'+' | b'-') = self.b.get(self.i) {
                self.i += 1;
            }
            if digits(self) == 0 {
                return self.err("invalid number");
            }
        }
        self.push(Kind::Number, start, self.i);
        Ok(())
    }

    /// At the opening quote.
    fn string(&mut self) -> Result<(), ParseError> {
        let start = self.i + 1;
        let mut i = start;
        let mut escaped = false;
        loop {
            i = special(self.b, i);
            match self.b.get(i) {
                Some(b'"') => break,
                Some(b'\\') => {
                    escaped = true;
                    i += 2;
                }
                Some(_) => {
                    self.i = i;
                    return self.err("control character in a string");
                }
                None => return self.err("unterminated string"),
            }
        }
        if escaped {
            // Escapes are rare in facts: let serde_json decode (and check) them.
            let decoded: String = match serde_json::from_str(&self.src[start - 1..=i]) {
                Ok(s) => s,
                Err(_) => return self.err("invalid escape in a string"),
            };
            self.tape
                .decoded
                .push((self.tape.tokens.len() as u32, decoded));
        }
        self.push(if escaped { Kind::EscapedStr } else { Kind::Str }, start, i);
        self.i = i + 1;
        Ok(())
    }
}

/// The index of the first `"`, `\` or control character at or after `i` (or the length).
/// Eight bytes at a time: facts are mostly strings, so this loop is most of a parse.
pub(super) fn special(b: &[u8], mut i: usize) -> usize {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    while let Some(chunk) = b.get(i..i + 8) {
        let x = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let zero = |v: u64| v.wrapping_sub(LO) & !v & HI;
        // Bytes below 0x20, equal to `"`, or equal to `\` (all below 0x80, so the classic
        // has-zero/has-less tricks mark exactly them, lowest first).
        let hit = zero(x ^ (LO * b'"' as u64))
            | zero(x ^ (LO * b'\\' as u64))
            | (x.wrapping_sub(LO * 0x20) & !x & HI);
        if hit != 0 {
            return i + (hit.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            return i;
        }
        i += 1;
    }
    i
}
