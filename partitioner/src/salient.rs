//! Salient-token selection: content words (nouns, verbs, adjectives, numbers) are salient;
//! function words are not (§4.1: "excluding function words, e.g. 'the', 'on'"). The paper uses a
//! part-of-speech tagger; a closed-class word list gives the same answer for function words,
//! which form a closed class, and needs no model. Callers with their own tagger pass their mask.

/// Closed-class English function words: articles and determiners, prepositions, conjunctions,
/// pronouns, auxiliaries and modals, and a few particles. Sorted, for binary search.
const FUNCTION_WORDS: &[&str] = &[
    "a",
    "about",
    "above",
    "across",
    "after",
    "against",
    "all",
    "along",
    "am",
    "among",
    "an",
    "and",
    "another",
    "any",
    "are",
    "around",
    "as",
    "at",
    "be",
    "because",
    "been",
    "before",
    "behind",
    "being",
    "below",
    "beneath",
    "beside",
    "besides",
    "between",
    "beyond",
    "both",
    "but",
    "by",
    "can",
    "could",
    "did",
    "do",
    "does",
    "down",
    "during",
    "each",
    "either",
    "every",
    "for",
    "from",
    "had",
    "has",
    "have",
    "having",
    "he",
    "her",
    "hers",
    "herself",
    "him",
    "himself",
    "his",
    "i",
    "if",
    "in",
    "inside",
    "into",
    "is",
    "it",
    "its",
    "itself",
    "may",
    "me",
    "might",
    "mine",
    "must",
    "my",
    "myself",
    "near",
    "neither",
    "nor",
    "not",
    "of",
    "off",
    "on",
    "onto",
    "or",
    "our",
    "ours",
    "ourselves",
    "out",
    "outside",
    "over",
    "shall",
    "she",
    "should",
    "so",
    "some",
    "than",
    "that",
    "the",
    "their",
    "theirs",
    "them",
    "themselves",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "through",
    "to",
    "toward",
    "towards",
    "under",
    "underneath",
    "until",
    "up",
    "upon",
    "us",
    "via",
    "was",
    "we",
    "were",
    "what",
    "whatever",
    "when",
    "where",
    "whether",
    "which",
    "while",
    "who",
    "whom",
    "whose",
    "will",
    "with",
    "within",
    "without",
    "would",
    "yet",
    "you",
    "your",
    "yours",
    "yourself",
];

/// Lower-cased word with leading and trailing punctuation removed ("Car." -> "car").
pub fn normalize_word(word: &str) -> String {
    word.trim_matches(|c: char| !c.is_alphanumeric())
        .to_lowercase()
}

/// Whether a (raw) word is a function word. Pure punctuation counts as a function word.
pub fn is_function_word(word: &str) -> bool {
    let w = normalize_word(word);
    w.is_empty() || FUNCTION_WORDS.binary_search(&w.as_str()).is_ok()
}

/// One flag per word: `true` for salient (content) words.
pub fn salient_mask<S: AsRef<str>>(words: &[S]) -> Vec<bool> {
    words
        .iter()
        .map(|w| !is_function_word(w.as_ref()))
        .collect()
}

/// Splits a prompt into words on whitespace, as the built-in tokenizer does.
pub fn split_words(prompt: &str) -> Vec<&str> {
    prompt.split_whitespace().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_is_sorted_and_unique() {
        for pair in FUNCTION_WORDS.windows(2) {
            assert!(pair[0] < pair[1], "{} !< {}", pair[0], pair[1]);
        }
    }

    #[test]
    fn content_and_function_words() {
        let words = split_words("A red circle top left and a blue square on the white background.");
        let mask = salient_mask(&words);
        let salient: Vec<&str> = words
            .iter()
            .zip(&mask)
            .filter(|(_, &m)| m)
            .map(|(w, _)| *w)
            .collect();
        assert_eq!(
            salient,
            [
                "red",
                "circle",
                "top",
                "left",
                "blue",
                "square",
                "white",
                "background."
            ]
        );
    }
}
