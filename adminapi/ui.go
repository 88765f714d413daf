package adminapi

import (
	"embed"
	"io/fs"
	"net/http"
)

// The dashboard: plain HTML, CSS and JavaScript embedded in the binary,
// with no library and nothing fetched from elsewhere, so it works offline.
//
//go:embed web
var webFiles embed.FS

func (s *Server) registerUI(mux *http.ServeMux) {
	sub, err := fs.Sub(webFiles, "web")
	if err != nil {
		panic(err) // the embedded tree is part of the build
	}
	files := http.FileServerFS(sub)
	page, err := fs.ReadFile(sub, "index.html")
	if err != nil {
		panic(err)
	}
	// The page at /, and at any other path no handler takes, with 404.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'")
		w.Header().Set("X-Frame-Options", "DENY")
		if r.URL.Path != "/" {
			w.WriteHeader(http.StatusNotFound)
		}
		if r.Method != http.MethodHead {
			_, _ = w.Write(page)
		}
	})
	mux.Handle("GET /ui/", http.StripPrefix("/ui/", files))
}
