//! Chapter 6.3: the limits a request must keep that the model does not set. Each bounds work
//! one request can make the server do: stop strings are matched against the text after every
//! token, and each context id of a chunk generation may cost a prefill.

use crate::errors::ApiError;

/// Per-request limits; every one is a setting of `nanoserve serve`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestLimits {
    /// Stop strings one request may give.
    pub max_stop_strings: usize,
    /// Bytes of one stop string.
    pub max_stop_string_bytes: usize,
    /// Context chunks one chunk generation may compose.
    pub max_context_ids: usize,
    /// Choices one request may ask for per prompt (`n`).
    pub max_n: usize,
    /// Prompts in one `/v1/completions` request.
    pub max_prompts: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_stop_strings: 16,
            max_stop_string_bytes: 256,
            max_context_ids: 32,
            max_n: 16,
            max_prompts: 32,
        }
    }
}

impl RequestLimits {
    /// The stop strings, if there are few and short enough.
    pub fn stop_strings(&self, stops: Vec<String>) -> Result<Vec<String>, ApiError> {
        if stops.len() > self.max_stop_strings {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "{} stop strings: at most {} are allowed",
                    stops.len(),
                    self.max_stop_strings
                ),
            ));
        }
        if let Some((i, s)) = stops
            .iter()
            .enumerate()
            .find(|(_, s)| s.len() > self.max_stop_string_bytes)
        {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "stop[{i}] has {} bytes: at most {} are allowed",
                    s.len(),
                    self.max_stop_string_bytes
                ),
            ));
        }
        Ok(stops)
    }

    /// `n`, if at least 1 and at most `max_n`.
    pub fn n(&self, n: u64) -> Result<usize, ApiError> {
        if n == 0 || n > self.max_n as u64 {
            return Err(ApiError::invalid(
                "n",
                format!("n = {n}: must be in 1..={}", self.max_n),
            ));
        }
        Ok(n as usize)
    }

    /// The prompts of a request, if there are few enough.
    pub fn prompts<T>(&self, prompts: Vec<T>) -> Result<Vec<T>, ApiError> {
        if prompts.len() > self.max_prompts {
            return Err(ApiError::invalid(
                "prompt",
                format!(
                    "{} prompts: at most {} are allowed in one request",
                    prompts.len(),
                    self.max_prompts
                ),
            ));
        }
        Ok(prompts)
    }

    /// The context ids, if there are few enough and none repeats (a repeat would compute and
    /// pin the same text's K/V once more for each time it is named).
    pub fn context_ids(&self, ids: Vec<String>) -> Result<Vec<String>, ApiError> {
        if ids.len() > self.max_context_ids {
            return Err(ApiError::invalid(
                "context_ids",
                format!(
                    "{} context ids: at most {} are allowed",
                    ids.len(),
                    self.max_context_ids
                ),
            ));
        }
        for (j, id) in ids.iter().enumerate() {
            if let Some(i) = ids[..j].iter().position(|earlier| earlier == id) {
                let param = format!("context_ids[{j}]");
                return Err(ApiError::invalid(
                    param.clone(),
                    format!("{param}: chunk {id:?} is already context_ids[{i}]"),
                ));
            }
        }
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_name_the_field() {
        let l = RequestLimits {
            max_stop_strings: 2,
            max_stop_string_bytes: 3,
            max_context_ids: 2,
            max_n: 2,
            max_prompts: 1,
        };
        assert_eq!(l.n(2).unwrap(), 2);
        assert!(l.n(3).is_err() && l.n(0).is_err());
        assert!(l.prompts(vec![1, 2]).is_err());
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(l.stop_strings(s(&["a", "bcd"])).unwrap(), s(&["a", "bcd"]));
        assert!(l.stop_strings(s(&["a", "b", "c"])).is_err());
        assert!(
            l.stop_strings(s(&["abcd"]))
                .unwrap_err()
                .message
                .starts_with("stop[0]")
        );
        assert_eq!(l.context_ids(s(&["x", "y"])).unwrap(), s(&["x", "y"]));
        let e = l.context_ids(s(&["x", "x"])).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("context_ids[1]"));
        assert!(l.context_ids(s(&["x", "y", "z"])).is_err());
    }
}
