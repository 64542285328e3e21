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
    fn first_of_keeps_sentences_apart() {
        assert_eq!(first_of::<String>(&[], 2), "");
        assert_eq!(first_of(&["x, y"], 2), "x, y");
        assert_eq!(first_of(&["a", "b", "c"], 2), "a; b; 1 more");
    }
}
