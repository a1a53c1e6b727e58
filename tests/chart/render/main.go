// fracgpu-chart-render renders a Helm chart the way `helm template` does, for tests on
// machines without helm: Go's text/template with Sprig's functions (the library Helm uses)
// plus Helm's own (include, tpl, required, fail, toYaml, fromYaml, toJson, fromJson,
// lookup), Helm's values coalescing (maps merge, null deletes) and the built-in objects
// .Values, .Release, .Chart, .Capabilities, .Files and .Template.
//
// It is a test tool, not Helm: no dependencies, hooks ordering, schema validation or
// cluster access (lookup returns nothing, as in `helm template`). Output: a JSON object
// mapping each rendered template's path to its text.
//
// Usage: fracgpu-chart-render -chart DIR [-f values.yaml ...] [-set-json JSON] \
//          [-name RELEASE] [-namespace NS] [-kube-version v1.20.2] [-api-versions a,b] \
//          [-release-service Helm]
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/semver/v3"
	"github.com/Masterminds/sprig/v3"
	yaml "gopkg.in/yaml.v2"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

type apiVersions []string

// Has answers .Capabilities.APIVersions.Has "group/version" or "group/version/Kind".
func (a apiVersions) Has(version string) bool {
	for _, v := range a {
		if v == version {
			return true
		}
	}
	return false
}

type files struct{ root string }

// Get returns a chart file's content, or "" when it does not exist (as Helm does).
func (f files) Get(name string) string {
	data, err := os.ReadFile(filepath.Join(f.root, filepath.FromSlash(name)))
	if err != nil {
		return ""
	}
	return string(data)
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fracgpu-chart-render:", err)
		os.Exit(1)
	}
}

func run() error {
	var valueFiles listFlag
	chartDir := flag.String("chart", "", "chart directory")
	flag.Var(&valueFiles, "f", "values file (repeatable, later wins)")
	setJSON := flag.String("set-json", "", "JSON object merged over the values last")
	name := flag.String("name", "fracgpu", "release name")
	namespace := flag.String("namespace", "fracgpu-system", "release namespace")
	kubeVersion := flag.String("kube-version", "v1.20.2", "Kubernetes version")
	extraAPIs := flag.String("api-versions", "", "comma-separated extra API versions")
	service := flag.String("release-service", "Helm", ".Release.Service (managed-by label)")
	flag.Parse()
	if *chartDir == "" {
		return errors.New("-chart is required")
	}

	chartMeta, err := readYAMLMap(filepath.Join(*chartDir, "Chart.yaml"))
	if err != nil {
		return err
	}
	values, err := readYAMLMap(filepath.Join(*chartDir, "values.yaml"))
	if err != nil {
		return err
	}
	for _, file := range valueFiles {
		override, err := readYAMLMap(file)
		if err != nil {
			return err
		}
		values = coalesce(values, override)
	}
	if *setJSON != "" {
		var override map[string]interface{}
		if err := json.Unmarshal([]byte(*setJSON), &override); err != nil {
			return fmt.Errorf("-set-json: %w", err)
		}
		values = coalesce(values, override)
	}
	version, err := semver.NewVersion(*kubeVersion)
	if err != nil {
		return fmt.Errorf("-kube-version: %w", err)
	}
	apis := defaultAPIVersions(version)
	if *extraAPIs != "" {
		apis = append(apis, strings.Split(*extraAPIs, ",")...)
	}

	chartName, _ := chartMeta["name"].(string)
	top := map[string]interface{}{
		"Values": values,
		"Release": map[string]interface{}{
			"Name": *name, "Namespace": *namespace, "Service": *service,
			"IsInstall": true, "IsUpgrade": false, "Revision": 1,
		},
		"Chart": map[string]interface{}{
			"Name": chartName, "Version": chartMeta["version"], "AppVersion": chartMeta["appVersion"],
		},
		"Capabilities": map[string]interface{}{
			"KubeVersion": map[string]interface{}{
				"Version": "v" + version.String(), "Major": fmt.Sprint(version.Major()),
				"Minor": fmt.Sprint(version.Minor()),
			},
			"APIVersions": apiVersions(apis),
		},
		"Files": files{root: *chartDir},
	}
	out, err := render(*chartDir, chartName, top)
	if err != nil {
		return err
	}
	encoded, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(append(encoded, '\n'))
	return err
}

func defaultAPIVersions(version *semver.Version) []string {
	apis := []string{
		"v1", "apps/v1", "batch/v1", "rbac.authorization.k8s.io/v1",
		"admissionregistration.k8s.io/v1", "apiextensions.k8s.io/v1", "coordination.k8s.io/v1",
		"policy/v1beta1", "policy/v1beta1/PodDisruptionBudget",
	}
	if version.Minor() >= 21 {
		apis = append(apis, "policy/v1", "policy/v1/PodDisruptionBudget")
	}
	return apis
}

func render(chartDir, chartName string, top map[string]interface{}) (map[string]string, error) {
	templateDir := filepath.Join(chartDir, "templates")
	entries, err := os.ReadDir(templateDir)
	if err != nil {
		return nil, err
	}
	root := template.New("gotpl")
	root.Option("missingkey=zero")
	funcs := funcMap(root)
	root.Funcs(funcs)
	var names []string
	for _, entry := range entries {
		if entry.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(templateDir, entry.Name()))
		if err != nil {
			return nil, err
		}
		name := path.Join(chartName, "templates", entry.Name())
		if _, err := root.New(name).Parse(string(data)); err != nil {
			return nil, err
		}
		names = append(names, name)
	}
	sort.Strings(names)
	out := map[string]string{}
	for _, name := range names {
		base := path.Base(name)
		if strings.HasPrefix(base, "_") {
			continue
		}
		data := withTemplate(top, name)
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, data); err != nil {
			return nil, err
		}
		out[name] = strings.ReplaceAll(buf.String(), "<no value>", "")
	}
	return out, nil
}

func withTemplate(top map[string]interface{}, name string) map[string]interface{} {
	data := map[string]interface{}{}
	for k, v := range top {
		data[k] = v
	}
	data["Template"] = map[string]interface{}{"Name": name, "BasePath": path.Dir(name)}
	return data
}

func funcMap(root *template.Template) template.FuncMap {
	funcs := sprig.TxtFuncMap()
	// Helm removes these: charts must not read the renderer's environment.
	delete(funcs, "env")
	delete(funcs, "expandenv")
	extra := template.FuncMap{
		"toYaml":   toYAML,
		"fromYaml": fromYAML,
		"toJson":   toJSON,
		"fromJson": fromJSON,
		"required": func(message string, value interface{}) (interface{}, error) {
			if value == nil {
				return nil, errors.New(message)
			}
			if s, ok := value.(string); ok && s == "" {
				return nil, errors.New(message)
			}
			return value, nil
		},
		"fail": func(message string) (string, error) { return "", errors.New(message) },
		"lookup": func(string, string, string, string) (map[string]interface{}, error) {
			return map[string]interface{}{}, nil
		},
		"include": func(name string, data interface{}) (string, error) {
			var buf bytes.Buffer
			if err := root.ExecuteTemplate(&buf, name, data); err != nil {
				return "", err
			}
			return buf.String(), nil
		},
		"tpl": func(text string, data interface{}) (string, error) {
			t, err := root.Clone()
			if err != nil {
				return "", err
			}
			t, err = t.New("tpl").Parse(text)
			if err != nil {
				return "", err
			}
			var buf bytes.Buffer
			if err := t.Execute(&buf, data); err != nil {
				return "", err
			}
			return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
		},
	}
	for k, v := range extra {
		funcs[k] = v
	}
	return funcs
}

// toYAML marshals like sigs.k8s.io/yaml (Helm's): through JSON, keys sorted, no trailing newline.
func toYAML(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	var generic interface{}
	if err := yaml.Unmarshal(data, &generic); err != nil {
		return ""
	}
	out, err := yaml.Marshal(generic)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(out), "\n")
}

// fromYAML parses like Helm: numbers become float64 (through JSON); errors go in "Error".
func fromYAML(text string) map[string]interface{} {
	var raw interface{}
	if err := yaml.Unmarshal([]byte(text), &raw); err != nil {
		return map[string]interface{}{"Error": err.Error()}
	}
	converted, ok := jsonShape(stringKeys(raw)).(map[string]interface{})
	if !ok {
		return map[string]interface{}{}
	}
	return converted
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(text string) map[string]interface{} {
	out := map[string]interface{}{}
	if err := json.Unmarshal([]byte(text), &out); err != nil {
		out["Error"] = err.Error()
	}
	return out
}

func readYAMLMap(file string) (map[string]interface{}, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var raw interface{}
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if raw == nil {
		return map[string]interface{}{}, nil
	}
	converted, ok := jsonShape(stringKeys(raw)).(map[string]interface{})
	if !ok {
		return nil, fmt.Errorf("%s: not a mapping", file)
	}
	return converted, nil
}

// stringKeys turns yaml.v2's map[interface{}]interface{} into map[string]interface{}.
func stringKeys(v interface{}) interface{} {
	switch value := v.(type) {
	case map[interface{}]interface{}:
		out := map[string]interface{}{}
		for k, item := range value {
			out[fmt.Sprint(k)] = stringKeys(item)
		}
		return out
	case []interface{}:
		out := make([]interface{}, len(value))
		for i, item := range value {
			out[i] = stringKeys(item)
		}
		return out
	default:
		return v
	}
}

// jsonShape round-trips through JSON so numbers are float64, as in Helm's values.
func jsonShape(v interface{}) interface{} {
	data, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out interface{}
	if err := json.Unmarshal(data, &out); err != nil {
		return v
	}
	return out
}

// coalesce merges override into base like Helm: maps merge, null deletes, others replace.
func coalesce(base, override map[string]interface{}) map[string]interface{} {
	out := map[string]interface{}{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range override {
		if v == nil {
			delete(out, k)
			continue
		}
		overrideMap, isMap := v.(map[string]interface{})
		baseMap, baseIsMap := out[k].(map[string]interface{})
		if isMap && baseIsMap {
			out[k] = coalesce(baseMap, overrideMap)
		} else {
			out[k] = v
		}
	}
	return out
}
