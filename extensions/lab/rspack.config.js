// Module ids from the modules' own names, not short hashes: which of them collide
// depended on the checkout's absolute path, so a checkout elsewhere built other ids
// (and CI found the committed panel stale). Named ids are the same wherever it is built.
module.exports = { optimization: { moduleIds: 'named' } };
