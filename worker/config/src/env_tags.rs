//! `!env NAME` tags, as the PowerSync service's config loader resolves them.

use serde_norway::Value;

/// Replaces every `!env NAME` tagged scalar with the value of the environment variable
/// `NAME` (read through `lookup`). Returns the first name that is not set.
pub(super) fn resolve(
    value: &mut Value,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(), String> {
    match value {
        Value::Tagged(tagged) if tagged.tag == "env" || tagged.tag == "!env" => {
            let name = match &tagged.value {
                Value::String(name) => name.trim().to_owned(),
                _ => return Err("<non-string !env tag>".to_owned()),
            };
            let resolved = lookup(&name).ok_or(name)?;
            *value = Value::String(resolved);
            Ok(())
        }
        Value::Tagged(tagged) => resolve(&mut tagged.value, lookup),
        Value::Sequence(items) => items.iter_mut().try_for_each(|item| resolve(item, lookup)),
        Value::Mapping(map) => map.values_mut().try_for_each(|item| resolve(item, lookup)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "PS_URI").then(|| "postgresql://u@h/db".to_owned())
    }

    #[test]
    fn resolves_nested_tags() {
        let mut v: Value =
            serde_norway::from_str("a:\n  - b: !env PS_URI\n  - c: plain\n").unwrap();
        resolve(&mut v, &env).unwrap();
        assert_eq!(v["a"][0]["b"], Value::String("postgresql://u@h/db".into()));
        assert_eq!(v["a"][1]["c"], Value::String("plain".into()));
    }

    #[test]
    fn reports_the_missing_name() {
        let mut v: Value = serde_norway::from_str("port: !env PS_PORT\n").unwrap();
        assert_eq!(resolve(&mut v, &env), Err("PS_PORT".to_owned()));
    }
}
