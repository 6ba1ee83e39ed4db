//! The naming rules, one each, for every name that reaches a URL, a SQL row or a file: the
//! server, the agent and the CLI check names through these. Every rule allows ASCII letters,
//! digits, `-`, `_` and `.`, and differs only in length and first character.

/// One naming rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub max_len: usize,
    /// The first character must be a letter or a digit (no `-x`, `.hidden`).
    pub alnum_first: bool,
}

/// Host names, as nodes are named: what an agent enrolls under and a token is bound to.
pub const HOSTNAME: Rule = Rule {
    max_len: 253,
    alnum_first: false,
};
/// Names people type: sites, tokens, plugins, tuning profiles.
pub const NAME: Rule = Rule {
    max_len: 64,
    alnum_first: true,
};
/// Test kinds (`nccl`, `rdma_ab`, ...).
pub const KIND: Rule = Rule {
    max_len: 64,
    alnum_first: false,
};
/// Test names of expectations and verdicts (`nccl.all_reduce`, `rdma_ab.all_reduce`).
pub const TEST: Rule = Rule {
    max_len: 128,
    alnum_first: false,
};
/// Rendezvous blob names (`nccl-uid`, `rdma_ab.rdma.nccl-uid`).
pub const RENDEZVOUS: Rule = Rule {
    max_len: 128,
    alnum_first: false,
};

impl Rule {
    pub fn allows(&self, name: &str) -> bool {
        !name.is_empty()
            && name.len() <= self.max_len
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && (!self.alnum_first || name.as_bytes()[0].is_ascii_alphanumeric())
    }

    /// What the rule asks for, for error messages.
    pub fn describe(&self) -> String {
        let first = if self.alnum_first {
            ", starting with a letter or digit"
        } else {
            ""
        };
        format!("1-{} letters, digits, '-', '_' or '.'{first}", self.max_len)
    }
}

/// Longest label (of a run, an investigation) or trait (a key or a value), in characters.
pub const MAX_LABEL_CHARS: usize = 200;

/// Free text people attach and others read (a run's or investigation's label, a node's
/// traits): any language, but at most [`MAX_LABEL_CHARS`] characters and nothing that
/// reads differently from what it is (control, invisible or direction-changing characters:
/// `env_policy::is_hidden`). `Err` says what is wrong, for a 422.
pub fn check_label(what: &str, text: &str) -> Result<(), String> {
    if text.chars().count() > MAX_LABEL_CHARS {
        return Err(format!(
            "{what} is longer than {MAX_LABEL_CHARS} characters"
        ));
    }
    if text.chars().any(crate::env_policy::is_hidden) {
        return Err(format!(
            "{what} holds a control character or an invisible or direction-changing one \
             (newline, U+202E, U+200B, ...): it would read differently from what it is"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert!(check_label("label", "nightly — rack 3, naïve µs, 夜間").is_ok());
        assert!(check_label("label", &"é".repeat(200)).is_ok());
        assert!(check_label("label", &"é".repeat(201)).is_err());
        for bad in ["a\u{202E}b", "a\u{2028}b", "a\u{200B}b", "a\nb", "a\u{0}b"] {
            assert!(check_label("label", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rules() {
        assert!(NAME.allows("rack-1.a_b"));
        assert!(!NAME.allows("-x"));
        assert!(!NAME.allows(""));
        assert!(!NAME.allows("a b"));
        assert!(!NAME.allows(&"a".repeat(65)));
        assert!(HOSTNAME.allows("-x") && HOSTNAME.allows(&"a".repeat(253)));
        assert!(!HOSTNAME.allows(&"a".repeat(254)));
        assert!(RENDEZVOUS.allows("rdma_ab.rdma.nccl-uid"));
        assert!(!RENDEZVOUS.allows("../etc"));
        assert!(!RENDEZVOUS.allows("a/b"));
        assert!(!KIND.allows("a b") && KIND.allows("rdma_ab"));
        assert_eq!(
            NAME.describe(),
            "1-64 letters, digits, '-', '_' or '.', starting with a letter or digit"
        );
    }
}
