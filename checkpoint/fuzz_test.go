package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseManifest runs its seeds under go test; `go test -run='^$' -fuzz=FuzzParseManifest
// ./checkpoint/` explores further. A manifest it accepts names only files inside the checkpoint, with
// well-formed checksums, and reads back the same once written again.
func FuzzParseManifest(f *testing.F) {
	empty := sha256.Sum256(nil)
	sum := hex.EncodeToString(empty[:])
	written, err := json.MarshalIndent(Manifest{Sequence: 7, Files: map[string]string{
		"model-0/checkpoint-n0000001-20240101-000000-initial.json": sum, "user/000.bin": sum, "state.json": sum,
	}}, "", "  ")
	require.NoError(f, err)
	for _, seed := range []string{
		string(written),
		`{"sequence":1,"files":{}}`,
		`{"sequence":1}`,
		`{"sequence":1,"files":null}`,
		`{"sequence":1,"files":{"a":"` + sum + `"},"extra":true}`,
		`null`, `{}`, `{`, `[]`, `""`, "\xff",
		`{"sequence":0,"files":{}}`,
		`{"sequence":-1,"files":{}}`,
		`{"sequence":1e400}`,
		`{"sequence":1.5}`,
		`{"sequence":1,"files":{"../x":"` + sum + `"}}`,
		`{"sequence":1,"files":{"/etc/passwd":"` + sum + `"}}`,
		`{"sequence":1,"files":{"a//b":"` + sum + `"}}`,
		`{"sequence":1,"files":{".":"` + sum + `"}}`,
		`{"sequence":1,"files":{"":"` + sum + `"}}`,
		`{"sequence":1,"files":{"a\\..\\..\\x":"` + sum + `"}}`,
		`{"sequence":1,"files":{"a":"XYZ"}}`,
		`{"sequence":1,"files":{"a":"` + strings.ToUpper(sum) + `"}}`,
		`{"sequence":1,"files":{"a":null}}`,
		`{"sequence":1,"files":{"a":1}}`,
		`{"sequence":1,"sequence":2,"files":{}} `,
		`{"sequence":1,"files":{}} trailing`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseManifest(data)
		if err != nil {
			require.Zero(t, m.Sequence)
			require.Nil(t, m.Files)
			return
		}
		require.GreaterOrEqual(t, m.Sequence, 1)
		dir := filepath.Join(t.TempDir(), "checkpoint-00000001")
		for rel, sum := range m.Files {
			require.True(t, fs.ValidPath(rel) && rel != ".", "file %q", rel)
			path := filepath.Join(dir, filepath.FromSlash(rel))
			require.True(t, strings.HasPrefix(path, dir+string(filepath.Separator)), "file %q is outside the checkpoint", rel)
			require.Len(t, sum, 64)
			_, err := hex.DecodeString(sum)
			require.NoError(t, err)
			require.Equal(t, strings.ToLower(sum), sum)
		}
		data, err = json.Marshal(m)
		require.NoError(t, err)
		again, err := parseManifest(data)
		require.NoError(t, err)
		require.Equal(t, m, again, "the manifest, written again, reads back the same")
	})
}
