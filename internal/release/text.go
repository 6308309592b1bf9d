package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// errNothingToRelease means CHANGELOG.md's Unreleased section is empty.
var errNothingToRelease = errors.New("CHANGELOG.md says nothing under Unreleased")

const unreleasedHeading = "## Unreleased\n"

// cutChangelog turns the Unreleased section of a changelog into version's, dated,
// under a new empty Unreleased section.
func cutChangelog(text, version, date string) (string, error) {
	if strings.Contains(text, "\n## "+version+" ") || strings.Contains(text, "\n## "+version+"\n") {
		return "", fmt.Errorf("CHANGELOG.md already has a section for %s", version)
	}
	i := strings.Index(text, "\n"+unreleasedHeading)
	if i < 0 {
		return "", fmt.Errorf("CHANGELOG.md has no %q heading", strings.TrimSpace(unreleasedHeading))
	}
	body := text[i+1+len(unreleasedHeading):]
	if j := strings.Index(body, "\n## "); j >= 0 {
		body = body[:j]
	}
	if strings.TrimSpace(body) == "" {
		return "", errNothingToRelease
	}
	return text[:i+1] + unreleasedHeading + "\n" + "## " + version + " (" + date + ")\n" + text[i+1+len(unreleasedHeading):], nil
}

// imageRef is the relay's image as the Kubernetes manifests name it.
var imageRef = regexp.MustCompile(`ghcr\.io/outboxd/outbox:[A-Za-z0-9._-]+`)

// manifests are the files that name the image, from the repository's root.
const manifests = "deploy/kubernetes/*.yaml"

// setImage makes every manifest under root name the image of version. It returns
// the files it changed.
func setImage(root, version string) ([]string, error) {
	names, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(manifests)))
	if err != nil {
		return nil, err
	}
	var changed []string
	for _, name := range names {
		data, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		out := imageRef.ReplaceAll(data, []byte("ghcr.io/outboxd/outbox:"+version))
		if string(out) == string(data) {
			continue
		}
		if err := os.WriteFile(name, out, 0o644); err != nil {
			return nil, err
		}
		rel, _ := filepath.Rel(root, name)
		changed = append(changed, filepath.ToSlash(rel))
	}
	return changed, nil
}
