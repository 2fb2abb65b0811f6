//! Warnings: rules that compile and sync, but that the official compiler
//! (`@powersync/service-sync-rules`) flags, because they are probably not what the author
//! meant or may stop working there.
//!
//! A warning never stops a deployment. It carries the same location as an error
//! ([`SqlLocation`]) so tooling can point at it, a stable code per kind, what the official
//! compiler says, and what to write instead (`docs/sync-rules.md`, "Warnings").

use std::fmt;

use super::error::SqlLocation;

/// What a warning is about; each kind has a stable code ([`WarningKind::code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WarningKind {
    /// A bucket definition's parameter query decides access from client parameters only
    /// (`request.parameters()`, `user_parameters`).
    ClientParameterQuery,
    /// A stream's bucket (edition 3) is chosen by unauthenticated values only
    /// (`subscription.*`, `connection.*`) and no `auth.*` value.
    UnauthenticatedParameter,
    /// An unquoted identifier written with capitals: it means its lower-case name.
    IdentifierCase,
    /// `streams` at edition 2, the alpha version of Sync Streams.
    AlphaStreams,
    /// An edition-2 stream subscribed by default reads subscription parameters, which are
    /// NULL for a default subscription.
    DefaultSubscriptionParameters,
    /// An output column without alias whose name is its text (edition 3).
    UnnamedColumn,
    /// `*` after an aliased column: a source column of the alias's name overwrites it.
    StarAfterAlias,
    /// A CTE no query of its scope reads.
    UnusedCte,
    /// `config.storage_version` names a version the official service calls unstable.
    UnstableStorageVersion,
}

impl WarningKind {
    /// A stable code for logs and tooling.
    pub fn code(self) -> &'static str {
        match self {
            WarningKind::ClientParameterQuery => "PSM_RULES_WARN_CLIENT_PARAMETERS",
            WarningKind::UnauthenticatedParameter => "PSM_RULES_WARN_UNAUTHENTICATED",
            WarningKind::IdentifierCase => "PSM_RULES_WARN_IDENTIFIER_CASE",
            WarningKind::AlphaStreams => "PSM_RULES_WARN_ALPHA_STREAMS",
            WarningKind::DefaultSubscriptionParameters => "PSM_RULES_WARN_DEFAULT_SUBSCRIPTION",
            WarningKind::UnnamedColumn => "PSM_RULES_WARN_UNNAMED_COLUMN",
            WarningKind::StarAfterAlias => "PSM_RULES_WARN_STAR_AFTER_ALIAS",
            WarningKind::UnusedCte => "PSM_RULES_WARN_UNUSED_CTE",
            WarningKind::UnstableStorageVersion => "PSM_RULES_WARN_STORAGE_VERSION",
        }
    }
}

/// One warning of a compiled sync-rules file ([`crate::SyncRules::warnings`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RulesWarning {
    /// What it is about.
    pub kind: WarningKind,
    /// Where: the rule, the query and the position of [`Self::excerpt`] in it. A warning
    /// about the file's structure rather than a query (an unused CTE, the `streams`
    /// section, `config`) has an empty `sql` and line 0.
    pub location: SqlLocation,
    /// The text warned about, as written: an identifier, a call, a column, a whole query,
    /// a CTE's name or a key.
    pub excerpt: String,
    /// What is wrong, with the official compiler's words for it.
    pub message: String,
    /// What to write instead.
    pub hint: String,
}

impl fmt::Display for RulesWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.location;
        if l.sql.is_empty() {
            write!(f, "[{}] {} `{}`", self.kind.code(), l.kind, l.rule)?;
            if !l.query_label.is_empty() {
                write!(f, ", {}", l.query_label)?;
            }
        } else {
            write!(f, "[{}] {l}", self.kind.code())?;
            if l.line > 0 && !self.excerpt.is_empty() && self.excerpt != l.sql {
                write!(f, " (`{}`)", self.excerpt)?;
            }
        }
        write!(f, ": {}. Fix: {}", self.message, self.hint)
    }
}
