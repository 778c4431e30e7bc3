//! Turning reference code into exercise code: solution regions become `todo!()`s.
//!
//! A lesson body sits between a `// BEGIN SOLUTION` and an `// END SOLUTION` line, always at
//! the tail of a function body, so replacing it with a `todo!(...)` still type-checks. The
//! message names the chapter section and the function to write, taken from the nearest `fn`
//! above the region and the first sentence of its doc comment.

const BEGIN: &str = "// BEGIN SOLUTION";
const END: &str = "// END SOLUTION";

/// One replaced region, for the listing the tool prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    pub section: String,
    pub function: String,
    pub hint: String,
}

/// Replaces every solution region of `source` with a `todo!` naming `chapter.k`, numbering
/// from `first_index`. Returns the new source and the regions in order.
pub fn replace_regions(
    source: &str,
    chapter: &str,
    first_index: usize,
) -> Result<(String, Vec<Region>), String> {
    let lines: Vec<&str> = source.lines().collect();
    let mut out = String::with_capacity(source.len());
    let mut regions = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.trim() != BEGIN {
            if line.trim() == END {
                return Err(format!("line {}: END SOLUTION without BEGIN", i + 1));
            }
            out.push_str(line);
            out.push('\n');
            i += 1;
            continue;
        }
        let end = (i + 1..lines.len())
            .find(|&j| lines[j].trim() == END || lines[j].trim() == BEGIN)
            .filter(|&j| lines[j].trim() == END)
            .ok_or_else(|| format!("line {}: BEGIN SOLUTION without END", i + 1))?;
        let indent = &line[..line.len() - line.trim_start().len()];
        let (function, hint) = describe(&lines[..i]);
        let section = format!("chapter {chapter}.{}", first_index + regions.len());
        let message = if hint.is_empty() {
            format!("{section}: write `{function}`")
        } else {
            format!("{section}: write `{function}`: {hint}")
        };
        out.push_str(&format!("{indent}todo!({message:?})\n"));
        regions.push(Region {
            section,
            function,
            hint,
        });
        i = end + 1;
    }
    Ok((out, regions))
}

/// The name of the nearest function above a region and the first sentence of its docs.
fn describe(before: &[&str]) -> (String, String) {
    let Some(at) = before.iter().rposition(|l| fn_name(l).is_some()) else {
        return ("this function".into(), String::new());
    };
    let name = fn_name(before[at]).unwrap_or_default();
    let mut docs: Vec<&str> = before[..at]
        .iter()
        .rev()
        .map(|l| l.trim())
        .skip_while(|l| l.starts_with("#["))
        .take_while(|l| l.starts_with("///"))
        .map(|l| l.trim_start_matches("///").trim())
        .collect();
    docs.reverse();
    let text = docs.join(" ");
    let sentence = match text.find(". ") {
        Some(end) => &text[..=end],
        None => text.as_str(),
    };
    (name, sentence.trim().to_string())
}

fn fn_name(line: &str) -> Option<String> {
    let t = line.trim_start();
    let rest = ["pub fn ", "fn ", "pub(crate) fn "]
        .iter()
        .find_map(|p| t.strip_prefix(p))?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = r#"impl Pool {
    /// Takes a free page. Errors when none is left.
    #[inline]
    pub fn allocate(&mut self) -> Result<u32, Error> {
        // BEGIN SOLUTION
        let p = self.free.pop()?;
        Ok(p)
        // END SOLUTION
    }

    fn helper(&self) -> usize {
        let x = 1;
        // BEGIN SOLUTION
        x + 1
        // END SOLUTION
    }
}
"#;

    #[test]
    fn regions_become_todos_named_after_their_function() {
        let (out, regions) = replace_regions(SOURCE, "1", 1).unwrap();
        assert!(!out.contains("SOLUTION"));
        assert!(!out.contains("self.free.pop()"));
        assert!(
            out.contains("        todo!(\"chapter 1.1: write `allocate`: Takes a free page.\")\n")
        );
        assert!(
            out.contains("        let x = 1;\n        todo!(\"chapter 1.2: write `helper`\")\n")
        );
        assert_eq!(regions.len(), 2);
        assert_eq!(regions[1].section, "chapter 1.2");
    }

    #[test]
    fn unbalanced_markers_are_errors() {
        assert!(replace_regions("// BEGIN SOLUTION\nx\n", "0", 1).is_err());
        assert!(replace_regions("x\n// END SOLUTION\n", "0", 1).is_err());
        assert!(
            replace_regions(
                "// BEGIN SOLUTION\n// BEGIN SOLUTION\n// END SOLUTION\n",
                "0",
                1
            )
            .is_err()
        );
    }

    #[test]
    fn files_without_regions_are_unchanged() {
        let src = "fn main() {}\n";
        assert_eq!(
            replace_regions(src, "0", 1).unwrap(),
            (src.to_string(), vec![])
        );
    }
}
