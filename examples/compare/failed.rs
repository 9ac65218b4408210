//! How the examples show an error in a Markdown table: a strategy or tier that failed gets its
//! row with the error, and the run goes on with the others.

/// `error` and its sources on one line, each source once (a `Display` that already contains
/// its source is not repeated), with the characters that would break a table cell escaped.
pub(crate) fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}
