//! `bucket_definitions` → data evaluators, lookup creators and request-side resolvers.

use super::lookup::{lookup_query, LookupQuery};
use super::select_list::data_projection;
use super::{one_row_table, row_scope};
use crate::bucket::BucketVersion;
use crate::error::RulesError;
use crate::fingerprint::{self, Fingerprint};
use crate::options::Compatibility;
use crate::plan::{DataEvaluator, LookupCreator, ParamFilter, TableRef};
use crate::request::{BucketResolver, ParamSource};
use crate::sql::filter::{classify, Cond, Filter, LinkTarget};
use crate::sql::lower::fix_in_precedence;
use crate::sql::parse::parse_select;
use crate::sql::scope::RequestStyle;
use crate::sql::QueryCtx;
use crate::yaml::RawDefinition;

/// What errors call a bucket definition.
const KIND: &str = "bucket definition";

/// A compiled bucket definition.
pub(crate) struct CompiledDefinition {
    pub resolvers: Vec<BucketResolver>,
    pub data: Vec<(TableRef, DataEvaluator)>,
    pub lookups: Vec<(TableRef, LookupCreator)>,
    pub params: Vec<String>,
    /// What the definition makes of rows (its bucket names carry it).
    pub fingerprint: Fingerprint,
}

/// Compile one definition.
pub(crate) fn compile(
    def: &RawDefinition,
    compat: Compatibility,
    version: BucketVersion,
) -> Result<CompiledDefinition, RulesError> {
    let fingerprint = fingerprint::of_definition(def, compat);
    let prefix = version.prefix(&def.name, &fingerprint);
    let lookups_as = super::lookup_source(version, &def.name, &fingerprint);
    let mut out = CompiledDefinition {
        resolvers: Vec::new(),
        data: Vec::new(),
        lookups: Vec::new(),
        params: Vec::new(),
        fingerprint,
    };
    // No `parameters`: one static query without outputs, i.e. the single bucket `name[]`.
    let global = [String::new()];
    let queries: &[String] = if def.parameters.is_empty() {
        &global
    } else {
        &def.parameters
    };
    let mut first = true;
    for (i, sql) in queries.iter().enumerate() {
        let ctx = QueryCtx::new(KIND, &def.name, format!("parameters[{i}]"), sql, compat);
        let mut q = if def.parameters.is_empty() {
            LookupQuery::single(
                crate::request::LookupGroup::Static {
                    outputs: Vec::new(),
                    filter: Vec::new(),
                },
                Vec::new(),
                None,
            )
        } else {
            let select = parse_select(&ctx, sql)?;
            lookup_query(
                &ctx,
                &select,
                &lookups_as,
                &i.to_string(),
                RequestStyle::Legacy,
            )?
        };
        if first {
            out.params = q.outputs.clone();
            first = false;
        } else {
            let mut a = out.params.clone();
            let mut b = q.outputs.clone();
            a.sort();
            b.sort();
            if a != b {
                return Err(ctx.err_at(
                    1,
                    1,
                    format!(
                        "bucket parameters must match across parameter queries: [{}] vs [{}]",
                        out.params.join(", "),
                        q.outputs.join(", ")
                    ),
                    "every parameter query of a definition outputs the same column names",
                ));
            }
        }
        let mut groups = Vec::new();
        let group = q.push_groups(&mut groups);
        let params = out
            .params
            .iter()
            .map(|p| ParamSource::Lookup {
                group,
                output: q.outputs.iter().position(|o| o == p).unwrap_or(0),
            })
            .collect();
        out.lookups.append(&mut q.creators);
        out.resolvers.push(BucketResolver {
            prefix: prefix.clone(),
            request_filters: Vec::new(),
            groups,
            params,
            priority: q.priority.or(def.priority),
            null_makes_no_bucket: false,
        });
    }
    for (j, sql) in def.data.iter().enumerate() {
        let ctx = QueryCtx::new(KIND, &def.name, format!("data[{j}]"), sql, compat);
        out.data.push(data_query(&ctx, sql, &prefix, &out.params)?);
    }
    Ok(out)
}

fn data_query(
    ctx: &QueryCtx<'_>,
    sql: &str,
    prefix: &str,
    params: &[String],
) -> Result<(TableRef, DataEvaluator), RulesError> {
    let select = parse_select(ctx, sql)?;
    let table = one_row_table(ctx, &select, "a data query")?;
    let mut scope = row_scope(&table, vec!["bucket".to_string()]);
    let shape = data_projection(ctx, &mut scope, &select)?;
    let mut used = Vec::new();
    let mut expanding = 0;
    let filter = match &select.selection {
        None => ParamFilter::Pred(crate::expr::Expr::Literal(crate::value::Value::Integer(1))),
        Some(w) => {
            let f = classify(ctx, &mut scope, &fix_in_precedence(w))?;
            to_param_filter(ctx, f, params, &mut used, &mut expanding)?
        }
    };
    let mut missing: Vec<&String> = params.iter().filter(|p| !used.contains(p)).collect();
    missing.sort();
    if !missing.is_empty() {
        return Err(ctx.err(
            select.select_token.0.span,
            format!(
                "query must cover all bucket parameters; missing: {}",
                missing
                    .iter()
                    .map(|m| format!("bucket.{m}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "compare a row column with every bucket parameter: `WHERE <column> = bucket.<name>`",
        ));
    }
    Ok((
        table.table.clone(),
        DataEvaluator {
            prefix: prefix.to_string(),
            // An unaliased wildcard table's rows show their own table's name.
            object_type: table
                .alias
                .clone()
                .or((!table.table.is_pattern()).then(|| table.table.name.clone())),
            slots: scope.slots,
            projection: shape.projection,
            explicit: shape.explicit,
            id: shape.id,
            filter,
            params: params.len(),
            table_suffix: table.table.is_pattern(),
            stream_columns: None,
        },
    ))
}

fn to_param_filter(
    ctx: &QueryCtx<'_>,
    f: Filter,
    params: &[String],
    used: &mut Vec<String>,
    expanding: &mut usize,
) -> Result<ParamFilter, RulesError> {
    Ok(match f {
        Filter::And(items) => ParamFilter::And(
            items
                .into_iter()
                .map(|i| to_param_filter(ctx, i, params, used, expanding))
                .collect::<Result<_, _>>()?,
        ),
        Filter::Or(items) => ParamFilter::Or(
            items
                .into_iter()
                .map(|i| to_param_filter(ctx, i, params, used, expanding))
                .collect::<Result<_, _>>()?,
        ),
        Filter::Leaf(Cond::Row(e)) => ParamFilter::Pred(e),
        Filter::Leaf(Cond::Link {
            row,
            row_expands,
            target: LinkTarget::Ref { name, span, .. },
            ..
        }) => {
            let Some(param) = params.iter().position(|p| *p == name) else {
                return Err(ctx.err(
                    span,
                    format!("`bucket.{name}` is not a parameter of this definition"),
                    if params.is_empty() {
                        "a global definition (no parameters) has no bucket.<name> references".to_string()
                    } else {
                        format!("one of: {}", params.iter().map(|p| format!("bucket.{p}")).collect::<Vec<_>>().join(", "))
                    },
                ));
            };
            if row_expands {
                *expanding += 1;
                if *expanding > 1 {
                    return Err(ctx.err(span, "cannot have multiple IN expressions on bucket parameters", "at most one `bucket.<p> IN <array column>` per query"));
                }
            }
            if !used.contains(&name) {
                used.push(name);
            }
            ParamFilter::Param {
                param,
                row,
                expands: row_expands,
            }
        }
        Filter::Leaf(Cond::Request(_))
        | Filter::Leaf(Cond::Link { .. })
        | Filter::Leaf(Cond::Subquery { .. })
        | Filter::Leaf(Cond::Gate { .. }) => {
            return Err(ctx.err_at(
                1,
                1,
                "data queries cannot read request values or use subqueries",
                "move request-dependent conditions into a parameter query and filter with bucket.<name>",
            ))
        }
    })
}
