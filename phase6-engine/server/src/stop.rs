//! Stop strings: the text of a request ends just before the first occurrence of any of them.
//!
//! Text arrives in pieces as tokens are decoded, and a stop string may span several pieces
//! (or several tokens may make up one character of it). So the end of the text that could
//! still grow into a stop string is held back; everything before it is safe to send. Nothing
//! of a stop string is ever streamed, and the request is cut as soon as one is seen.

/// What a new piece of text gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scan {
    /// Text that can be sent (possibly empty); no stop string yet.
    Emit(String),
    /// A stop string was found: the text before it, and the request ends.
    Stopped(String),
}

#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text received but not yet sent: a suffix that may begin a stop string.
    held: String,
}

impl StopStrings {
    /// `stops` must not contain an empty string (the request parser refuses those).
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            held: String::new(),
        }
    }

    pub fn push(&mut self, piece: &str) -> Scan {
        if self.stops.is_empty() {
            return Scan::Emit(piece.to_string());
        }
        self.held.push_str(piece);
        let first = self.stops.iter().filter_map(|s| self.held.find(s)).min();
        if let Some(at) = first {
            self.held.truncate(at);
            return Scan::Stopped(std::mem::take(&mut self.held));
        }
        let keep = self
            .stops
            .iter()
            .map(|s| longest_prefix_at_end(&self.held, s))
            .max()
            .unwrap_or(0);
        let rest = self.held.split_off(self.held.len() - keep);
        Scan::Emit(std::mem::replace(&mut self.held, rest))
    }

    /// The held-back text, when the request ends for another reason.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length of the longest proper prefix of `stop` that `text` ends with.
fn longest_prefix_at_end(text: &str, stop: &str) -> usize {
    (1..stop.len())
        .rev()
        .filter(|&k| stop.is_char_boundary(k))
        .find(|&k| text.ends_with(&stop[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, Option<String>) {
        let mut s = StopStrings::new(stops.iter().map(|s| s.to_string()).collect());
        let mut sent = Vec::new();
        for p in pieces {
            match s.push(p) {
                Scan::Emit(t) => sent.push(t),
                Scan::Stopped(t) => return (sent, Some(t)),
            }
        }
        sent.push(s.flush());
        (sent, None)
    }

    #[test]
    fn a_stop_string_across_pieces_is_never_sent() {
        let (sent, stopped) = run(&["\n\n"], &["Hello", " world\n", "\nmore"]);
        assert_eq!(sent, vec!["Hello", " world"]);
        assert_eq!(stopped.as_deref(), Some(""));
    }

    #[test]
    fn a_false_start_is_released() {
        let (sent, stopped) = run(&["END"], &["the E", "N", "d of it"]);
        assert_eq!(sent.concat(), "the ENd of it");
        assert_eq!(sent[0], "the ");
        assert_eq!(stopped, None);
    }

    #[test]
    fn the_earliest_of_several_wins() {
        let (sent, stopped) = run(&["cd", "b"], &["abcde"]);
        assert!(sent.is_empty());
        assert_eq!(stopped.as_deref(), Some("a"));
    }

    #[test]
    fn multibyte_text_is_split_on_characters() {
        let (sent, stopped) = run(&["é!"], &["café", "?", "é", "!"]);
        assert_eq!(sent.concat(), "café?");
        assert_eq!(stopped.as_deref(), Some(""));
        let (sent, stopped) = run(&[], &["anything"]);
        assert_eq!((sent.concat(), stopped), ("anything".into(), None));
    }
}
