//! PostgreSQL column types: the built-in OIDs the conversion knows, their names, and which
//! of them are arrays of what.

/// The PostgreSQL type of a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PgType {
    /// The type OID (`pg_type.oid`), as pgoutput's Relation message gives it.
    pub oid: u32,
    /// For array types, the element type OID. [`PgType::from_oid`] fills it for built-in
    /// array types; the source must fill it for arrays of other types (`typelem`).
    pub element: Option<u32>,
}

impl PgType {
    /// A type from its OID; built-in array types get their element type.
    pub fn from_oid(oid: u32) -> Self {
        PgType {
            oid,
            element: builtin_array_element(oid),
        }
    }

    /// A type from a PostgreSQL type name (`int8`, `bigint`, `text[]`, `_int4`,
    /// `timestamptz`, ...); used by the CLI and tests. `None` for unknown names.
    pub fn from_name(name: &str) -> Option<Self> {
        type_from_name(name)
    }
}

/// Built-in type OIDs used by the conversion.
pub mod oid {
    #![allow(missing_docs)]
    pub const BOOL: u32 = 16;
    pub const BYTEA: u32 = 17;
    pub const CHAR: u32 = 18;
    pub const NAME: u32 = 19;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const OID: u32 = 26;
    pub const JSON: u32 = 114;
    pub const XML: u32 = 142;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const MONEY: u32 = 790;
    pub const BPCHAR: u32 = 1042;
    pub const VARCHAR: u32 = 1043;
    pub const DATE: u32 = 1082;
    pub const TIME: u32 = 1083;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const INTERVAL: u32 = 1186;
    pub const TIMETZ: u32 = 1266;
    pub const NUMERIC: u32 = 1700;
    pub const UUID: u32 = 2950;
    pub const PG_LSN: u32 = 3220;
    pub const JSONB: u32 = 3802;
}

/// (array OID, element OID, element name) for built-in types.
const ARRAYS: &[(u32, u32, &str)] = &[
    (1000, oid::BOOL, "bool"),
    (1001, oid::BYTEA, "bytea"),
    (1002, oid::CHAR, "char"),
    (1003, oid::NAME, "name"),
    (1005, oid::INT2, "int2"),
    (1007, oid::INT4, "int4"),
    (1009, oid::TEXT, "text"),
    (1014, oid::BPCHAR, "bpchar"),
    (1015, oid::VARCHAR, "varchar"),
    (1016, oid::INT8, "int8"),
    (1021, oid::FLOAT4, "float4"),
    (1022, oid::FLOAT8, "float8"),
    (1028, oid::OID, "oid"),
    (199, oid::JSON, "json"),
    (3807, oid::JSONB, "jsonb"),
    (1182, oid::DATE, "date"),
    (1183, oid::TIME, "time"),
    (1115, oid::TIMESTAMP, "timestamp"),
    (1185, oid::TIMESTAMPTZ, "timestamptz"),
    (1187, oid::INTERVAL, "interval"),
    (1231, oid::NUMERIC, "numeric"),
    (2951, oid::UUID, "uuid"),
    (1270, oid::TIMETZ, "timetz"),
    (791, oid::MONEY, "money"),
    (3221, oid::PG_LSN, "pg_lsn"),
];

const NAMES: &[(&str, u32)] = &[
    ("bool", oid::BOOL),
    ("boolean", oid::BOOL),
    ("bytea", oid::BYTEA),
    ("char", oid::CHAR),
    ("name", oid::NAME),
    ("int8", oid::INT8),
    ("bigint", oid::INT8),
    ("int2", oid::INT2),
    ("smallint", oid::INT2),
    ("int4", oid::INT4),
    ("int", oid::INT4),
    ("integer", oid::INT4),
    ("text", oid::TEXT),
    ("oid", oid::OID),
    ("json", oid::JSON),
    ("xml", oid::XML),
    ("float4", oid::FLOAT4),
    ("real", oid::FLOAT4),
    ("float8", oid::FLOAT8),
    ("double precision", oid::FLOAT8),
    ("money", oid::MONEY),
    ("bpchar", oid::BPCHAR),
    ("varchar", oid::VARCHAR),
    ("character varying", oid::VARCHAR),
    ("date", oid::DATE),
    ("time", oid::TIME),
    ("timestamp", oid::TIMESTAMP),
    ("timestamptz", oid::TIMESTAMPTZ),
    ("timestamp with time zone", oid::TIMESTAMPTZ),
    ("timestamp without time zone", oid::TIMESTAMP),
    ("time without time zone", oid::TIME),
    ("time with time zone", oid::TIMETZ),
    ("character", oid::BPCHAR),
    ("interval", oid::INTERVAL),
    ("timetz", oid::TIMETZ),
    ("numeric", oid::NUMERIC),
    ("decimal", oid::NUMERIC),
    ("uuid", oid::UUID),
    ("pg_lsn", oid::PG_LSN),
    ("jsonb", oid::JSONB),
];

/// The element type of a built-in array type.
pub fn builtin_array_element(array_oid: u32) -> Option<u32> {
    ARRAYS
        .iter()
        .find(|(a, _, _)| *a == array_oid)
        .map(|(_, e, _)| *e)
}

/// Parse a type name (`int8`, `text[]`, `_int4`); `None` when unknown.
pub fn type_from_name(name: &str) -> Option<PgType> {
    let n = name.trim().to_ascii_lowercase();
    let (base, is_array) = if let Some(b) = n.strip_suffix("[]") {
        (b.to_string(), true)
    } else if let Some(b) = n.strip_prefix('_') {
        (b.to_string(), true)
    } else {
        (n, false)
    };
    let elem = NAMES.iter().find(|(k, _)| *k == base).map(|(_, o)| *o)?;
    if !is_array {
        return Some(PgType::from_oid(elem));
    }
    let arr = ARRAYS
        .iter()
        .find(|(_, e, _)| *e == elem)
        .map(|(a, _, _)| *a)?;
    Some(PgType {
        oid: arr,
        element: Some(elem),
    })
}
