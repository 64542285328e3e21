//! Lists in messages: a few items of a longer list and a count of the rest, so an admission
//! message, a condition or an event names what matters and stays short.

use std::fmt::Display;

/// "a, b, c and 9 more": a few names of a longer list.
pub fn some_of<T: Display>(items: &[T], shown: usize) -> String {
    let mut names = shown_and_rest(items, shown);
    match names.len() {
        0 => String::new(),
        1 => names.remove(0),
        n => format!("{} and {}", names[..n - 1].join(", "), names[n - 1]),
    }
}

/// "a; b; c; and 9 more": a few sentences (which may hold commas) of a longer list.
pub fn first_of<T: Display>(items: &[T], shown: usize) -> String {
    shown_and_rest(items, shown).join("; ")
}

/// `text` cut to at most `max_chars` characters, ending in `…` when cut: for messages limited
/// in characters (the API server truncates an admission warning past 256).
pub fn clip_chars(text: String, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text;
    }
    let mut clipped: String = text.chars().take(max_chars.saturating_sub(1)).collect();
    clipped.push('…');
    clipped
}

/// `text` cut to at most `max_bytes` (at a character boundary), ending in `…` when cut: for
/// messages the API server limits in bytes (an Event's note is at most 1024).
pub fn clip(text: String, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text;
    }
    let ellipsis = '…';
    let mut end = max_bytes.saturating_sub(ellipsis.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{ellipsis}", &text[..end])
}

fn shown_and_rest<T: Display>(items: &[T], shown: usize) -> Vec<String> {
    let mut said: Vec<String> = items.iter().take(shown).map(ToString::to_string).collect();
    let rest = items.len().saturating_sub(shown);
    if rest > 0 {
        said.push(format!("{rest} more"));
    }
    said
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn some_of_names_a_few_and_counts_the_rest() {
        assert_eq!(some_of::<String>(&[], 3), "");
        assert_eq!(some_of(&["a"], 3), "a");
        assert_eq!(some_of(&["a", "b"], 3), "a and b");
        assert_eq!(some_of(&["a", "b", "c", "d", "e"], 3), "a, b, c and 2 more");
    }

    #[test]
    fn clip_cuts_at_a_character_boundary_within_the_limit() {
        assert_eq!(clip("short".into(), 10), "short");
        let clipped = clip("é".repeat(600), 900);
        assert!(
            clipped.len() <= 900 && clipped.ends_with('…'),
            "{}",
            clipped.len()
        );
    }

    #[test]
    fn first_of_keeps_sentences_apart() {
        assert_eq!(first_of::<String>(&[], 2), "");
        assert_eq!(first_of(&["x, y"], 2), "x, y");
        assert_eq!(first_of(&["a", "b", "c"], 2), "a; b; 1 more");
    }
}
