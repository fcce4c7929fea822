// Command argocd-health judges a resource's health with Argo CD's own code, the way Argo CD's
// application controller does for a resource customization in argocd-cm.
//
// The health script reaches Argo CD as a key of the argocd-cm ConfigMap
// (resource.customizations.health.<group>_<Kind>). This program builds that ConfigMap (or reads
// one, -argocd-cm), parses it with Argo CD's settings manager (util/settings, as
// `argocd admin settings resource-overrides health` does) and evaluates the resource with
// gitops-engine's health.GetResourceHealth over util/lua's ResourceHealthOverrides: the calls
// controller/health.go makes for an Application's resources. With -builtin the script runs the
// way Argo CD's own unit test runs its built-in scripts (util/lua health_test.go: a VM with the
// standard libraries open, ExecuteHealthLua), which is how a contributed
// resource_customizations/<group>/<Kind>/health.lua would be tested upstream.
//
//	argocd-health -script health.lua resource.yaml...     one JSON line per resource
//	argocd-health -argocd-cm argocd-cm.yaml resource.yaml...
//	argocd-health -script health.lua -tests health_test.yaml
//	    every case of an Argo CD health_test.yaml: one JSON array of
//	    {inputPath, expected, got, error, match}; exit 1 if any case differs
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/argoproj/gitops-engine/pkg/health"
	log "github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/argoproj/argo-cd/v3/common"
	"github.com/argoproj/argo-cd/v3/util/lua"
	"github.com/argoproj/argo-cd/v3/util/settings"
)

type result struct {
	Status  health.HealthStatusCode `json:"status"`
	Message string                  `json:"message"`
	Error   string                  `json:"error,omitempty"`
}

type testCase struct {
	InputPath    string              `json:"inputPath"`
	HealthStatus health.HealthStatus `json:"healthStatus"`
}

type testFile struct {
	Tests []testCase `json:"tests"`
}

type caseResult struct {
	InputPath string              `json:"inputPath"`
	Expected  health.HealthStatus `json:"expected"`
	Got       result              `json:"got"`
	Match     bool                `json:"match"`
}

// readObject decodes a resource as the controller's cluster cache holds it (the unstructured JSON
// scheme: whole numbers are int64), or with -builtin as Argo CD's health_test.go reads its
// testdata (sigs.k8s.io/yaml into a map: float64). Lua sees a number either way.
func readObject(path string, builtin bool) (*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if builtin {
		obj := map[string]any{}
		if err := yaml.Unmarshal(data, &obj); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return &unstructured.Unstructured{Object: obj}, nil
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(js); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return obj, nil
}

// configMapFor is the argocd-cm a user writes from the chart's README: the script under
// resource.customizations.health.<group>_<Kind>.
func configMapFor(script string, obj *unstructured.Unstructured) *corev1.ConfigMap {
	gk := obj.GroupVersionKind().GroupKind()
	key := "resource.customizations.health." + gk.Kind
	if gk.Group != "" {
		key = "resource.customizations.health." + gk.Group + "_" + gk.Kind
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: common.ArgoCDConfigMapName},
		Data:       map[string]string{key: script},
	}
}

// parsed caches overridesFrom by argocd-cm content: the cases of one health_test.yaml share it.
var parsed = map[string]lua.ResourceHealthOverrides{}

// overridesFrom parses argocd-cm with Argo CD's settings manager over a fake clientset, as
// `argocd admin settings resource-overrides health --argocd-cm-path` does.
func overridesFrom(ctx context.Context, cm *corev1.ConfigMap) (lua.ResourceHealthOverrides, error) {
	key, err := yaml.Marshal(cm.Data)
	if err != nil {
		return nil, err
	}
	if o, ok := parsed[string(key)]; ok {
		return o, nil
	}
	cm = cm.DeepCopy()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: common.ArgoCDSecretName},
		Data:       map[string][]byte{"admin.password": []byte("test"), "server.secretkey": []byte("test")},
	}
	for _, o := range []metav1.Object{cm, secret} {
		o.SetNamespace("default")
		o.SetLabels(map[string]string{"app.kubernetes.io/part-of": "argocd"})
	}
	manager := settings.NewSettingsManager(ctx, fake.NewClientset(secret, cm), "default")
	if err := manager.ResyncInformers(); err != nil {
		return nil, err
	}
	overrides, err := manager.GetResourceOverrides()
	if err != nil {
		return nil, err
	}
	parsed[string(key)] = overrides
	return overrides, nil
}

func evaluate(ctx context.Context, obj *unstructured.Unstructured, script string, cm *corev1.ConfigMap, builtin bool) result {
	var hs *health.HealthStatus
	var err error
	if builtin {
		// util/lua health_test.go: VM{UseOpenLibs: true}, then ExecuteHealthLua.
		hs, err = lua.VM{UseOpenLibs: true}.ExecuteHealthLua(obj, script)
	} else {
		if cm == nil {
			cm = configMapFor(script, obj)
		}
		var overrides lua.ResourceHealthOverrides
		overrides, err = overridesFrom(ctx, cm)
		if err == nil {
			// controller/health.go: health.GetResourceHealth(res.Live, healthOverrides)
			hs, err = health.GetResourceHealth(obj, overrides)
		}
	}
	r := result{}
	if hs != nil {
		r.Status, r.Message = hs.Status, hs.Message
	}
	if err != nil {
		r.Error = err.Error()
	}
	if hs == nil && err == nil {
		r.Error = "no health check applies to " + obj.GroupVersionKind().String()
	}
	return r
}

func run() (int, error) {
	scriptPath := flag.String("script", "", "the Lua health script")
	cmPath := flag.String("argocd-cm", "", "an argocd-cm ConfigMap YAML carrying the script (instead of -script)")
	testsPath := flag.String("tests", "", "an Argo CD health_test.yaml; inputPath is relative to its directory")
	builtin := flag.Bool("builtin", false, "run as Argo CD runs a built-in script in its unit test (standard libraries open)")
	flag.Parse()
	log.SetLevel(log.WarnLevel) // the settings manager's informer chatter
	ctx := context.Background()

	var script string
	var cm *corev1.ConfigMap
	switch {
	case *scriptPath != "" && *cmPath == "":
		data, err := os.ReadFile(*scriptPath)
		if err != nil {
			return 2, err
		}
		script = string(data)
	case *cmPath != "" && *scriptPath == "" && !*builtin:
		data, err := os.ReadFile(*cmPath)
		if err != nil {
			return 2, err
		}
		cm = &corev1.ConfigMap{}
		if err := yaml.Unmarshal(data, cm); err != nil {
			return 2, fmt.Errorf("%s: %w", *cmPath, err)
		}
	default:
		return 2, errors.New("give -script, or -argocd-cm without -builtin")
	}

	out := json.NewEncoder(os.Stdout)
	if *testsPath != "" {
		data, err := os.ReadFile(*testsPath)
		if err != nil {
			return 2, err
		}
		var tf testFile
		if err := yaml.UnmarshalStrict(data, &tf); err != nil {
			return 2, fmt.Errorf("%s: %w", *testsPath, err)
		}
		if len(tf.Tests) == 0 {
			return 2, fmt.Errorf("%s: no tests", *testsPath)
		}
		results := make([]caseResult, 0, len(tf.Tests))
		code := 0
		for _, tc := range tf.Tests {
			obj, err := readObject(filepath.Join(filepath.Dir(*testsPath), tc.InputPath), *builtin)
			if err != nil {
				return 2, err
			}
			got := evaluate(ctx, obj, script, cm, *builtin)
			// util/lua health_test.go: assert.Equal(t, &test.HealthStatus, result)
			match := got.Error == "" && got.Status == tc.HealthStatus.Status && got.Message == tc.HealthStatus.Message
			if !match {
				code = 1
			}
			results = append(results, caseResult{tc.InputPath, tc.HealthStatus, got, match})
		}
		return code, out.Encode(results)
	}
	if flag.NArg() == 0 {
		return 2, errors.New("no resource YAML given")
	}
	code := 0
	for _, path := range flag.Args() {
		obj, err := readObject(path, *builtin)
		if err != nil {
			return 2, err
		}
		r := evaluate(ctx, obj, script, cm, *builtin)
		if r.Error != "" {
			code = 1
		}
		if err := out.Encode(r); err != nil {
			return 2, err
		}
	}
	return code, nil
}

func main() {
	code, err := run()
	if err != nil {
		fmt.Fprintln(os.Stderr, "argocd-health:", err)
	}
	os.Exit(code)
}
