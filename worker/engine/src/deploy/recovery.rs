//! Crash recovery at start: a build the configured rules still want is resumed; every
//! other store the storage directory holds beside the served one is retired. A data file
//! that is not a powersync_mdbx store is left where it is.

use std::sync::Arc;

use super::{blocking, Generations};
use crate::EngineError;
use replication::BootstrapIntent;
use store::DataFile;

impl Generations {
    /// Resumes the build of `config_rules` if the directory holds one; retires every
    /// other store that is not the served one (left by a crash during a deploy or its
    /// switch).
    pub(super) async fn sort_out_others(&mut self, config_rules: &str) -> Result<(), EngineError> {
        let others = blocking({
            let (root, active) = (self.root.clone(), self.active.dir().to_owned());
            move || store::other_stores(&root, &active)
        })
        .await?;
        for dir in others {
            // What the data file is, with its bootstrap record; the rules record too when
            // it is ours.
            let (found, rules) = blocking({
                let dir = dir.clone();
                move || {
                    let found = store::inspect_data_file(&dir, BootstrapIntent::KEY);
                    let rules = match found {
                        DataFile::Ours { .. } => {
                            store::stage_record_of_any_format(&dir, BootstrapIntent::RULES_KEY)
                                .ok()
                                .flatten()
                        }
                        _ => None,
                    };
                    Ok((found, rules))
                }
            })
            .await?;
            let intent = match found {
                DataFile::NotOurs { reason } => {
                    // Never removed: it may be someone's data (the same rule as reset()'s).
                    tracing::warn!(
                        dir = %dir.display(),
                        "PSM_E1006 left alone: {} is not a powersync_mdbx store ({reason}); \
                         move it out of the storage directory",
                        dir.join(store::STORE_FILES[0]).display()
                    );
                    continue;
                }
                DataFile::Ours { record, .. } => record.ok().flatten(),
                DataFile::Absent => None,
            };
            let resumable = match (intent, rules) {
                (Some(intent), Some(rules)) => BootstrapIntent::decode(&intent)
                    .ok()
                    .map(|i| i.generation)
                    .filter(|g| {
                        dir != self.root
                            && self.build.is_none()
                            && rules.as_slice() == config_rules.as_bytes()
                            && config_rules != self.active.rules.text()
                            && *g > self.active.number
                    }),
                _ => None,
            };
            if let Some(number) = resumable {
                tracing::info!(dir = %dir.display(), "resuming the interrupted rules deploy");
                self.start_build(Arc::from(config_rules), Some((dir, number)))
                    .await;
            } else {
                tracing::info!(dir = %dir.display(), "removing a generation left behind");
                self.retire_dir(dir);
            }
        }
        Ok(())
    }
}
