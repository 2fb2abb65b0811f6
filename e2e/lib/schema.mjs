// The client schema for the fixture's rules (e2e/fixture/sync-config.yaml and
// e2e/fixture/sync-rules-legacy.yaml): every stream and bucket definition selects the same
// columns of `tasks` into the output table `tasks`.
import { Schema, Table, column } from '@powersync/node';

import { buildSchema, TABLES } from './columns.mjs';

export const schema = buildSchema({ Schema, Table, column });

export { TABLES };

/**
 * Values `uploadData` supplies for NOT NULL columns of the primary that the rules do not
 * sync (so the client cannot hold them) when a local insert creates a row.
 */
export function SERVER_DEFAULTS(user) {
  return { tasks: { owner_id: user ?? 'e2e-client' } };
}
