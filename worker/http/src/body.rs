//! The response body every handler answers with: [`Body`].

/// The body type every handler answers with, whole or streamed.
pub type Body = http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>;

/// An empty [`Body`].
pub(crate) fn empty_body() -> Body {
    use http_body_util::BodyExt;
    http_body_util::Empty::new().boxed()
}
