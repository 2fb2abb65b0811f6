// Client credentials: a fixed PSM_TOKEN, or HS256 tokens signed here from PSM_JWT_SECRET
// (base64url) for PSM_USER, a fresh one for every fetchCredentials call.
import { createHmac } from 'node:crypto';

export const AUDIENCE = 'powersync-mdbx-test';
export const KID = 'psm-e2e';

const b64url = (data) => Buffer.from(data).toString('base64url');

/** Signs an HS256 JWT with the raw key bytes `key`. */
export function signHs256(key, claims, kid = KID) {
  const header = b64url(JSON.stringify({ alg: 'HS256', typ: 'JWT', kid }));
  const body = b64url(JSON.stringify(claims));
  const signature = createHmac('sha256', key).update(`${header}.${body}`).digest('base64url');
  return `${header}.${body}.${signature}`;
}

export function credentialsSource(env, fail) {
  let fetched = 0;
  const fixed = env.PSM_TOKEN;
  const secret = env.PSM_JWT_SECRET;
  const user = env.PSM_USER;
  const ttl = Number(env.PSM_TOKEN_TTL_S ?? 600);
  if (!fixed && !(secret && user)) fail('set PSM_TOKEN, or PSM_JWT_SECRET and PSM_USER');
  return {
    next() {
      fetched += 1;
      if (fixed) return fixed;
      const iat = Math.floor(Date.now() / 1000);
      return signHs256(Buffer.from(secret, 'base64url'), { sub: user, aud: AUDIENCE, iat, exp: iat + ttl });
    },
    count: () => fetched
  };
}
