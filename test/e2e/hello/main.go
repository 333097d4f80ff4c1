// Command hello is the workload of the end-to-end tests (image localhost/constellation/hello).
//
// Without arguments it is an HTTP server on :8080 (or $PORT) that answers every request with
// its pod name ($POD_NAME, else the hostname), so a test can tell which replica answered.
//
// With $DATA_DIR set (a volume) it also serves /data: PUT stores the body in $DATA_DIR/data, GET
// returns what was stored, so a test can tell that a volume kept its data.
//
// "hello get URL..." is the client: it fetches each URL, retrying for up to a minute (the
// server, its Service or DNS may still be coming up), prints each answer, and exits non-zero
// if any URL never answered 200. On SIGTERM the server keeps serving for 5 s (lame duck), so
// that a deleted replica is out of every node's kube-proxy rules before it stops.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 2 && os.Args[1] == "get" {
		if err := get(os.Args[2:]); err != nil {
			log.Fatalf("hello get: %v", err)
		}
		return
	}
	serve()
}

func serve() {
	name := os.Getenv("POD_NAME")
	if name == "" {
		host, err := os.Hostname()
		if err != nil {
			log.Fatalf("hello: hostname: %v", err)
		}
		name = host
	}
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "hello from %s\n", name)
	})
	if dir := os.Getenv("DATA_DIR"); dir != "" {
		http.HandleFunc("/data", func(w http.ResponseWriter, r *http.Request) { data(w, r, filepath.Join(dir, "data")) })
	}
	srv := &http.Server{Addr: ":" + port, ReadHeaderTimeout: 5 * time.Second}
	// A pod that is deleted gets SIGTERM while every node's kube-proxy may still send it
	// traffic for a second or so (until it has seen the endpoint go): it keeps serving for
	// lameDuck before it stops, as a workload that wants no failed request must (e2e TestUpgrade
	// once counted a request that went to a replica that had exited on SIGTERM at once).
	go func() {
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
		<-stop
		log.Printf("hello: %s stopping in %v (lame duck)", name, lameDuck)
		time.Sleep(lameDuck)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}()
	log.Printf("hello: %s listening on :%s", name, port)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// data serves the stored data in file: PUT replaces it (1 MiB at most), GET returns it.
func data(w http.ResponseWriter, r *http.Request, file string) {
	switch r.Method {
	case http.MethodPut:
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err == nil {
			err = os.WriteFile(file, body, 0o644)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, "stored %d bytes\n", len(body))
	case http.MethodGet:
		body, err := os.ReadFile(file)
		if errors.Is(err, os.ErrNotExist) {
			http.Error(w, "nothing stored", http.StatusNotFound)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write(body)
	default:
		http.Error(w, "GET or PUT", http.StatusMethodNotAllowed)
	}
}

// lameDuck is how long hello keeps serving after SIGTERM.
const lameDuck = 5 * time.Second

func get(urls []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := &http.Client{Timeout: 5 * time.Second}
	for _, url := range urls {
		for attempt := 1; ; attempt++ {
			body, err := fetch(ctx, client, url)
			if err == nil {
				fmt.Printf("%s: %s", url, body)
				break
			}
			log.Printf("%s: attempt %d: %v", url, attempt, err)
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s: no answer: %w", url, err)
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

func fetch(ctx context.Context, client *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s", resp.Status)
	}
	return body, nil
}
