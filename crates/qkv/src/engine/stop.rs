//! Stop strings in streamed text. A reply must never show part of a stop string and then
//! end: text that could be the start of one is held back until the next pieces either
//! complete the stop (the text ends before it) or rule it out (it is sent).

/// Text waiting to be sent, and the stop strings that end a reply.
#[derive(Debug, Default)]
pub struct StopFilter {
    stops: Vec<String>,
    pending: String,
}

/// What one piece of text releases.
#[derive(Debug, PartialEq, Eq)]
pub struct Released {
    /// Text that can be sent now.
    pub text: String,
    /// A stop string was completed: the reply ends with `text`.
    pub stopped: bool,
}

impl StopFilter {
    /// Empty stop strings are dropped (they would end every reply at once).
    pub fn new(stops: Vec<String>) -> Self {
        StopFilter {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    /// Adds a piece of generated text.
    pub fn push(&mut self, piece: &str) -> Released {
        self.pending.push_str(piece);
        // the earliest complete stop ends the reply right before it
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let text = self.pending[..at].to_string();
            self.pending.clear();
            return Released {
                text,
                stopped: true,
            };
        }
        // hold back the longest tail that begins some stop string
        let cut = self
            .pending
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.pending[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.pending.len());
        let text = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        Released {
            text,
            stopped: false,
        }
    }

    /// The text held back when the reply ends for another reason (end of sequence,
    /// length): it completed no stop, so it is sent.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// The reply's last piece, `rest`: what it releases and, unless it completes a stop,
    /// everything still held back.
    pub fn last(&mut self, rest: &str) -> Released {
        let mut r = self.push(rest);
        if !r.stopped {
            r.text.push_str(&self.finish());
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut f = StopFilter::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let r = f.push(p);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        let r = f.last("");
        out.push_str(&r.text);
        (out, r.stopped)
    }

    #[test]
    fn a_stop_split_across_pieces_never_shows_and_ends_the_text() {
        assert_eq!(
            run(&["END"], &["ab", "cE", "N", "Dxyz"]),
            ("abc".into(), true)
        );
        let mut f = StopFilter::new(vec!["END".into()]);
        assert_eq!(f.push("abcE").text, "abc");
        assert_eq!(f.push("N").text, "");
        assert_eq!(
            f.push("Dx"),
            Released {
                text: String::new(),
                stopped: true
            }
        );
    }

    #[test]
    fn a_false_start_is_released_and_the_earliest_stop_wins() {
        assert_eq!(run(&["END"], &["aE", "Nb", "c"]), ("aENbc".into(), false));
        assert_eq!(run(&["b", "a"], &["xab"]), ("x".into(), true));
        assert_eq!(
            run(&["\n\n", "</s>"], &["one\n", "two</", "s>"]),
            ("one\ntwo".into(), true)
        );
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&[""], &["a"]), ("a".into(), false));
    }

    #[test]
    fn text_held_at_the_end_is_sent_whole_and_characters_stay_whole() {
        assert_eq!(run(&["你好吗"], &["说你", "好"]), ("说你好".into(), false));
        assert_eq!(run(&["好吗"], &["你好", "吗？"]), ("你".into(), true));
    }
}
